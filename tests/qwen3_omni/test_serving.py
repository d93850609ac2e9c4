"""Qwen3-Omni behind `omnistage serve` on the inline deploy (the default deploy's stages and async chunk on
both edges, as threads of one process: the three-process start-up would double this module's time): chat
answers in text and audio (streamed as audio deltas), the speech route speaks with the checkpoint's
speakers, and both are the reference's greedy output."""

import base64
import io
import json

import numpy as np
import pytest
import soundfile as sf

from tests.qwen3_omni.conftest import FRAMES, PROMPTS, THINKER_TOKENS
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.e2e
MESSAGES = [{"role": "user", "content": PROMPTS["text"]}]
VOICE = "Ethan"  # the text reference's speaker
STAGE_PARAMS = [
    {"temperature": 0, "max_tokens": THINKER_TOKENS},
    {"temperature": 0, "max_tokens": FRAMES, "repetition_penalty": 1.05},
    {},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, omni3_dir):
    root = tmp_path_factory.mktemp("qwen3_omni")
    deploy = "omnistage/families/qwen3_omni/qwen3_omni_inline.yaml"
    args = ["serve", str(omni3_dir), "--deploy-config", deploy, "--storage-dir", str(root / "storage")]
    proc = ServerProcess(args, root / "server.log", module="omnistage")
    try:
        proc.wait_healthy(timeout=300)
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model_name(client):
    (model,) = client.models.list().data
    assert model.model_extra["modalities"] == ["text", "audio"]
    return model.id


@pytest.fixture(scope="module")
def expected(references, omni3_dir):
    """(text, int16 samples) of the reference for the chat route's prompt."""
    from transformers import AutoTokenizer

    ref = references["text"]
    text = AutoTokenizer.from_pretrained(omni3_dir).decode(ref.text_ids, skip_special_tokens=True)
    return text, as_int16(ref.waveform.numpy())


def as_int16(samples: np.ndarray) -> np.ndarray:
    return (samples.clip(-1, 1) * 32767).round().astype(np.int16)


def assert_reference_audio(got: np.ndarray, want: np.ndarray) -> None:
    """Async-chunk audio within 1e-4 of the reference waveform: at most 4 int16 steps."""
    assert got.shape == want.shape and np.abs(want).max() > 1000
    assert int(np.abs(got.astype(np.int32) - want.astype(np.int32)).max()) <= 4


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    return sf.read(io.BytesIO(data), dtype="int16")


def test_chat_answers_in_text_and_the_reference_audio(client, model_name, expected):
    reply = client.chat.completions.create(
        model=model_name,
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": VOICE, "format": "wav"},
        extra_body={"stage_params": STAGE_PARAMS},
    )
    message = reply.choices[0].message
    text, want = expected
    assert message.content == text and reply.usage.completion_tokens == THINKER_TOKENS
    samples, rate = read_wav(base64.b64decode(message.audio.data))
    assert rate == 24000
    assert_reference_audio(samples, want)

    stream = client.chat.completions.create(
        model=model_name,
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": VOICE, "format": "wav"},
        stream=True,
        extra_body={"stage_params": STAGE_PARAMS},
    )
    by_modality: dict[str, list[str]] = {"text": [], "audio": []}
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            by_modality[chunk.model_extra["modality"]].append(chunk.choices[0].delta.content)
    assert "".join(by_modality["text"]) == text
    assert len(by_modality["audio"]) >= 2  # code2wav decodes while the talker still speaks
    pieces = [read_wav(base64.b64decode(piece))[0] for piece in by_modality["audio"]]
    assert_reference_audio(np.concatenate(pieces), want)


def test_speech_route_speaks_with_the_checkpoint_speakers(client, server, model_name, expected):
    import httpx

    voices = httpx.get(server.url + "/v1/audio/voices", timeout=30).json()["voices"]
    assert {"Aiden", "Chelsie", "Ethan"} <= set(voices)
    response = client.audio.speech.with_raw_response.create(
        model=model_name,
        input=PROMPTS["text"],
        voice=VOICE,
        response_format="wav",
        extra_body={"stage_params": STAGE_PARAMS},
    )
    samples, rate = read_wav(response.http_response.content)
    assert rate == 24000
    assert_reference_audio(samples, expected[1])

    sse = {"model": model_name, "input": PROMPTS["text"], "voice": VOICE, "response_format": "pcm"}
    body = {**sse, "stream": True, "stage_params": STAGE_PARAMS}
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done" and len(events) >= 3
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert_reference_audio(np.frombuffer(pcm, "<i2"), expected[1])


def test_text_only_answers_and_unknown_voices(client, server, model_name, expected):
    reply = client.chat.completions.create(
        model=model_name, messages=MESSAGES, modalities=["text"], extra_body={"stage_params": STAGE_PARAMS}
    )
    assert reply.choices[0].message.content == expected[0] and reply.choices[0].message.audio is None

    import httpx

    body = {"model": model_name, "messages": MESSAGES, "modalities": ["text", "audio"], "voice": "alloy"}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert "alloy" in response.json()["error"]["message"]
