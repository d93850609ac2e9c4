"""POST /v1/audio/generate on a real tiny Stable Audio checkpoint (its own server): the audio is the plain
diffusers pipeline's for the same fields and seed, `audio_length` sets its length, and bad fields are 400s
naming them, including a length past the checkpoint's longest clip."""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from omnistage.serving.media import pcm16
from tests.speech.stages import wait_idle
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.e2e
NAME = "tiny-stable-audio"


@pytest.fixture(scope="module")
def audio_dir():
    from omnistage.families.diffusers.tiny import tiny_pipeline_dir

    return tiny_pipeline_dir(NAME)


@pytest.fixture(scope="module")
def audio_http(audio_dir, tmp_path_factory) -> Iterator[httpx.Client]:
    root = tmp_path_factory.mktemp("audio-server")
    args = ["serve", str(audio_dir), "--served-model-name", NAME, "--voices-dir", str(root / "voices")]
    server = ServerProcess(args, root / "server.log", module="omnistage")
    try:
        server.wait_healthy(timeout=300)
        with httpx.Client(base_url=server.url, timeout=120) as http:
            yield http
    finally:
        server.stop()


def plain_mono_pcm(audio_dir, **call) -> np.ndarray:
    """The plain diffusers call, mixed to mono and quantized as the server sends it."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(audio_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    seed = call.pop("seed")
    stereo = pipe(**call, output_type="np", generator=torch.Generator().manual_seed(seed)).audios[0]
    return np.frombuffer(pcm16(np.asarray(stereo, dtype=np.float32).mean(0)), "<i2").astype(np.int32)


def test_generated_audio_is_the_plain_pipelines(audio_http, audio_dir):
    fields = {
        "input": "rain on a roof",
        "negative_prompt": "hum",
        "guidance_scale": 4.0,
        "num_inference_steps": 2,
    }
    reply = audio_http.post(
        "/v1/audio/generate",
        json={**fields, "model": NAME, "seed": 3, "audio_length": 0.005, "response_format": "pcm"},
    )
    assert reply.status_code == 200, reply.text
    assert (
        reply.headers["content-type"] == "audio/pcm" and reply.headers["x-omnistage-sample-rate"] == "16000"
    )
    served = np.frombuffer(reply.content, "<i2").astype(np.int32)
    expected = plain_mono_pcm(
        audio_dir,
        prompt=fields["input"],
        negative_prompt="hum",
        guidance_scale=4.0,
        num_inference_steps=2,
        audio_end_in_s=0.005,
        seed=3,
    )
    assert len(served) == len(expected) == 80  # 0.005 s at 16 kHz
    assert np.abs(served - expected).max() <= 1 and np.abs(served).max() > 0

    # Unset length: the checkpoint's longest clip (0.008 s); the WAV carries the same samples.
    wav = audio_http.post("/v1/audio/generate", json={**fields, "seed": 3}).content
    samples, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == 16000 and len(samples) == 128
    assert np.array_equal(samples[:80].astype(np.int32), served)  # the shorter clip is the longer one's start
    other = audio_http.post("/v1/audio/generate", json={**fields, "seed": 4}).content
    assert other != wav
    wait_idle(audio_http, NAME)


@pytest.mark.parametrize(
    ("body", "param", "text"),
    [
        ({"input": "  "}, "input", "cannot be empty"),
        ({"input": "x" * 4097}, "input", "4096"),
        ({"input": "x", "audio_length": 1.0}, "audio_length", "max_output_audio_seconds of 0.008"),
        ({"input": "x", "audio_length": -1}, "audio_length", ""),
        ({"input": "x", "response_format": "ogg"}, "response_format", ""),
        ({"input": "x", "num_inference_steps": 500}, "num_inference_steps", ""),
        ({"input": "x", "model": "gpt-9"}, "model", "gpt-9"),
    ],
)
def test_bad_fields_are_400_naming_them(audio_http, body, param, text):
    reply = audio_http.post("/v1/audio/generate", json=body)
    assert reply.status_code in (400, 404), reply.text
    error = reply.json()["error"]
    assert error["param"] == param and text in error["message"], error
    wait_idle(audio_http, NAME)
