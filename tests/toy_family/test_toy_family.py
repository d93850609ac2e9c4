"""A family defined only in this folder, served end to end: its decoder-layer form makes the lean decoder run
its layers, its extra model input reaches the decoder (greedy tokens equal transformers' on the shifted
embeddings), its typed speech option is checked by the speech route, and its step adapter steps Stable
Diffusion on the diffusion engine (images equal the plain diffusers pipeline's)."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch
from PIL import Image

from omnistage import Omni, SamplingParams
from omnistage.families.llm.tiny import tiny_llm_dir
from tests.support.server_process import ServerProcess
from tests.support.toy_stages import VOCAB, ToyVocoder
from tests.toy_family.diffusion import toy_sd_dir
from tests.toy_family.pipeline import TOY_SD, TOY_SPEAKER

pytestmark = pytest.mark.e2e
TEXT = "The toy family speaks."
SHIFT = 0.5
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("toy-family")
    args = ["--storage-dir", str(root / "storage"), "--voices-dir", str(root / "voices")]
    server = ServerProcess(args, root / "server.log", module="tests.toy_family.launch")
    try:
        server.wait_healthy(timeout=240)
        yield server
    finally:
        server.stop()


def reference_tokens(prompt_ids: list[int], shift: float) -> list[int]:
    """transformers' greedy continuation with `shift` added to every prompt embedding."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llm_dir("llama"), dtype=torch.float32).eval()
    ids = torch.tensor([prompt_ids])
    embeds = model.get_input_embeddings()(ids) + shift
    with torch.no_grad():
        out = model.generate(inputs_embeds=embeds, max_new_tokens=MAX_TOKENS, do_sample=False)
    return out[0].tolist()


def spoken(tokens: list[int]) -> np.ndarray:
    """The runtime's toy vocoder on `tokens` (its weights are seeded), as the vocoder stage speaks them."""
    with torch.no_grad():
        (wave,) = ToyVocoder(200).generate([torch.tensor(tokens) % VOCAB], [None])
    return wave.numpy()


@pytest.fixture(scope="module")
def talker_run() -> dict:
    """The toy talker through the Python API, its stages in their own processes: tokens and its path."""
    prompt = {"input": TEXT, "messages": [{"role": "user", "content": TEXT}], "toy_shift": SHIFT}
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0), None]
    with Omni(TOY_SPEAKER, model_dir=str(tiny_llm_dir("llama"))) as omni:
        (out,) = omni.generate([prompt], params, modalities=["text"], use_tqdm=False)
        stats = {s["stage_id"]: s["result"] for s in omni.stats()["stages"]}
    return {"out": out, "stats": stats}


def test_the_layer_form_runs_the_familys_layers_lean(talker_run: dict) -> None:
    path = talker_run["stats"][0]["decoder_path"]
    assert "lean decoder over 2 ToyDecoderLayer layers" in path, path


def test_the_extra_input_reaches_the_decoder(talker_run: dict) -> None:
    out = talker_run["out"]
    assert out.error is None and len(out.token_ids) == MAX_TOKENS
    assert out.token_ids == reference_tokens(out.prompt_token_ids, SHIFT)
    assert out.token_ids != reference_tokens(out.prompt_token_ids, 0.0)  # the shift changed the answer


def test_the_speech_route_takes_the_typed_option(server: ServerProcess, talker_run: dict) -> None:
    body = {"model": "toy-speaker", "input": TEXT, "max_new_tokens": MAX_TOKENS, "response_format": "wav"}
    reply = httpx.post(server.url + "/v1/audio/speech", json={**body, "toy_shift": SHIFT}, timeout=120)
    assert reply.status_code == 200, reply.text
    audio, _ = sf.read(io.BytesIO(reply.content), dtype="float32")
    expected = spoken(talker_run["out"].token_ids)
    assert audio.shape == expected.shape
    assert np.abs(audio - np.clip(expected, -1, 1)).max() <= 2 / 32767  # 16-bit WAV: rounding and scale
    unshifted = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert unshifted.status_code == 200 and unshifted.content != reply.content


@pytest.mark.parametrize(
    "option,says",
    [
        ({"toy_shift": "a lot"}, "toy_shift"),
        ({"toy_shift": 5}, "toy_shift"),
        ({"task_type": "Base"}, "does not take task_type (its speech options: toy_shift)"),
    ],
)
def test_bad_or_undeclared_options_are_400_naming_them(
    server: ServerProcess, option: dict, says: str
) -> None:
    body = {"model": "toy-speaker", "input": TEXT, **option}
    reply = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == next(iter(option)) and says in error["message"]


def test_the_step_adapter_steps_stable_diffusion(server: ServerProcess) -> None:
    from diffusers import DiffusionPipeline

    body = {"model": "toy-sd", "prompt": "a red circle", "size": "32x32", "num_inference_steps": 4, "seed": 3}
    reply = httpx.post(
        server.url + "/v1/images/generations", json={**body, "guidance_scale": 5.0}, timeout=120
    )
    assert reply.status_code == 200, reply.text
    png = base64.b64decode(reply.json()["data"][0]["b64_json"])
    served = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
    pipe = DiffusionPipeline.from_pretrained(str(toy_sd_dir()))
    plain = pipe(
        "a red circle",
        height=32,
        width=32,
        num_inference_steps=4,
        guidance_scale=5.0,
        generator=torch.Generator().manual_seed(3),
        output_type="np",
    ).images[0]
    expected = (plain * 255).round().clip(0, 255).astype(np.uint8)
    assert np.abs(served.astype(int) - expected.astype(int)).max() <= 1


def test_the_diffusion_stage_ran_step_by_step(tmp_path: Path) -> None:
    with Omni(TOY_SD, model_dir=str(toy_sd_dir())) as omni:
        (stage,) = omni.stats()["stages"]
    assert stage["result"]["mode"] == "step" and stage["result"]["pipeline"] == "StableDiffusionPipeline"
