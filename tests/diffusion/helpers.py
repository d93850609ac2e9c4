"""Helpers for the diffusion engine tests: tiny real-architecture pipelines, an engine driver, and
plain diffusers calls as the reference."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from PIL import Image

from omnistage.config.deploy import StageDeploy
from omnistage.families.diffusers.tiny import tiny_pipeline_dir
from omnistage.params import DiffusionParams
from omnistage.stages.base import StageRequest
from omnistage.stages.diffusion.engine import DiffusionEngine

FAMILIES = ["tiny-wan21-t2v", "tiny-wan22-i2v", "tiny-flux1", "tiny-sd3", "tiny-qwen-image"]
VIDEO = {"tiny-wan21-t2v", "tiny-wan22-i2v"}
TRUE_CFG = {"tiny-flux1", "tiny-qwen-image"}
# Small enough for 2 cores: 32x32 pixels, 5 frames, 2 steps, 16 text tokens.
BASE = {
    "height": 32,
    "width": 32,
    "num_inference_steps": 2,
    "max_sequence_length": 16,
    "output_format": "tensor",
}


@functools.cache
def model_dir(name: str) -> str:
    return str(tiny_pipeline_dir(name))


def input_image(seed: int) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(32, 32, 3) * 255).astype("uint8"))


def make_engine(name: str, max_num_seqs: int = 4, **engine_args: Any) -> DiffusionEngine:
    deploy = StageDeploy(stage_id=0, max_num_seqs=max_num_seqs, dtype="float32")
    return DiffusionEngine(model_dir(name), deploy, engine_args=engine_args)


def request(rid: str, prompt: Any, **params: Any) -> StageRequest:
    return StageRequest(rid, prompt=prompt, params=DiffusionParams(**params))


def drain(engine: DiffusionEngine, max_steps: int = 1000) -> dict[str, list]:
    """Step the engine until it has no work; every output per request id, in order."""
    outputs: dict[str, list] = {}
    for _ in range(max_steps):
        if not engine.has_work():
            return outputs
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
    raise AssertionError("engine still had work after max_steps")


def final_tensor(out) -> torch.Tensor:
    assert out.finished and out.error is None, out.error
    candidates = (out.video, out.images, out.tensors.get("audios"), out.audio)
    return next(value for value in candidates if value is not None)


@functools.cache
def plain_pipeline(name: str):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(model_dir(name), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference(name: str, prompt: str, seed: int, image=None, **kw: Any) -> torch.Tensor:
    """A plain diffusers call, written out by hand (independent of the engine's argument mapping)."""
    kw = {**BASE, **kw}
    kw.pop("output_format")
    num_outputs = kw.pop("num_outputs", 1)
    call = dict(prompt=prompt, generator=torch.Generator().manual_seed(seed), output_type="np", **kw)
    if name in VIDEO:
        call.setdefault("num_frames", 5)
        call["num_videos_per_prompt"] = num_outputs
    else:
        call["num_images_per_prompt"] = num_outputs
    if image is not None:
        call["image"] = image
    result = plain_pipeline(name)(**call)
    return torch.as_tensor(result.frames if name in VIDEO else result.images)


def family_engine(directory: Any, **engine_args: Any) -> DiffusionEngine:
    """A family's checkpoint (outside the five above) on the diffusion engine: fp32, 8 slots, with every
    family's registrations loaded (its step adapter among them)."""
    from omnistage.families.registry import load

    load()
    deploy = StageDeploy(stage_id=0, max_num_seqs=8, dtype="float32")
    return DiffusionEngine(str(directory), deploy, engine_args=engine_args)


@functools.cache
def plain_pipeline_at(directory: str):
    """The diffusers pipeline of a checkpoint directory, as a user loads it."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(directory, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def check_an_abort_frees_the_slot(engine: DiffusionEngine, base: dict[str, Any]) -> None:
    """Two requests share the first step; one aborted between steps leaves the other to finish alone."""
    engine.add_request(request("long", "a cat", **{**base, "num_inference_steps": 6}, seed=1))
    engine.add_request(request("keep", "a dog", **base, seed=2))
    assert {o.request_id for o in engine.step()} == {"long", "keep"}
    engine.abort("long")
    rest = drain(engine)
    assert "long" not in rest and rest["keep"][-1].error is None and engine.stats()["num_requests"] == 0


def each_alone(engine: DiffusionEngine, cases: list, base: dict[str, Any]) -> dict[str, torch.Tensor]:
    """(request id, prompt, fields) cases run one after another: each one's final tensor."""
    out = {}
    for rid, prompt, fields in cases:
        engine.add_request(request(rid, prompt, **{**base, **fields}))
        out[rid] = final_tensor(drain(engine)[rid][-1])
    return out


def all_at_once(engine: DiffusionEngine, cases: list, base: dict[str, Any]) -> tuple[set, dict]:
    """The cases added together: (the requests the first step advanced, each one's final tensor)."""
    for rid, prompt, fields in cases:
        engine.add_request(request(rid, prompt, **{**base, **fields}))
    first = {o.request_id for o in engine.step()}
    outs = drain(engine)
    return first, {rid: final_tensor(outs[rid][-1]) for rid, _, _ in cases}


def assert_each_close(got: dict, expected: dict, tolerance: float) -> None:
    for rid, want in expected.items():
        assert (got[rid].reshape(want.shape) - want).abs().max() <= tolerance, rid
