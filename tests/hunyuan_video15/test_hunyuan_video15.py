"""HunyuanVideo-1.5 text to video step by step (omnistage/families/hunyuan_video15, a tiny checkpoint of
diffusers' and transformers' own classes): each clip equals the plain `HunyuanVideo15Pipeline` call for the
same seed within 1e-4 (its guider at the request's guidance scale), alone and four at once (a quoted glyph
text, a negative prompt, no guidance, another length); an abort between steps frees the slot; the served
model answers `/v1/videos/sync` with the same clip."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from omnistage import media
from omnistage.config.deploy import StageDeploy
from omnistage.families.hunyuan_video15.tiny import tiny_hunyuan_video15_dir
from omnistage.families.registry import load
from omnistage.serving import media as served_media
from omnistage.stages.diffusion.engine import DiffusionEngine
from tests.diffusion.helpers import drain, final_tensor, request

pytestmark = pytest.mark.engine
TOLERANCE = 1e-4
BASE = {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 3, "output_format": "tensor"}
CASES = [
    ("a", "a cat walking", {"seed": 1}),
    ("b", 'a sign that says "OPEN" in the rain', {"seed": 2, "negative_prompt": "blurry"}),
    ("c", "waves", {"seed": 3, "guidance_scale": 1.0}),
    ("d", "a robot", {"seed": 4, "guidance_scale": 3.5, "num_frames": 9}),
]


def engine(**engine_args) -> DiffusionEngine:
    load()
    deploy = StageDeploy(stage_id=0, max_num_seqs=8, dtype="float32")
    return DiffusionEngine(str(tiny_hunyuan_video15_dir()), deploy, engine_args=engine_args)


@functools.cache
def plain_pipeline():
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(tiny_hunyuan_video15_dir()), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference(prompt: str, fields: dict) -> torch.Tensor:
    """The plain call; a guidance scale goes to its guider, as the pipeline takes it."""
    call = {**BASE, **fields}
    call.pop("output_format")
    seed, scale = call.pop("seed"), call.pop("guidance_scale", None)
    pipe = plain_pipeline()
    guider = pipe.guider
    pipe.guider = guider.new(guidance_scale=scale) if scale is not None else guider
    try:
        frames = pipe(
            prompt=prompt, generator=torch.Generator().manual_seed(seed), output_type="np", **call
        ).frames
    finally:
        pipe.guider = guider
    return torch.as_tensor(frames)


@pytest.fixture(scope="module")
def references() -> dict[str, torch.Tensor]:
    return {rid: reference(prompt, fields) for rid, prompt, fields in CASES}


def test_each_clip_equals_the_plain_pipeline_alone_and_four_at_once(references) -> None:
    solo = engine()
    assert solo.mode == "step"
    for rid, prompt, fields in CASES:
        solo.add_request(request(rid, prompt, **{**BASE, **fields}))
        got = final_tensor(drain(solo)[rid][-1])
        assert (got.reshape(references[rid].shape) - references[rid]).abs().max() <= TOLERANCE, rid
    batched = engine(step_token_budget=0)  # no per-forward budget: same-shape requests share forwards
    for rid, prompt, fields in CASES:
        batched.add_request(request(rid, prompt, **{**BASE, **fields}))
    assert {o.request_id for o in batched.step()} >= {"a", "b", "c"}
    outs = drain(batched)
    for rid, _, _ in CASES:
        got = final_tensor(outs[rid][-1])
        assert (got.reshape(references[rid].shape) - references[rid]).abs().max() <= TOLERANCE, rid


def test_an_abort_between_steps_frees_the_slot() -> None:
    eng = engine(step_token_budget=0)
    eng.add_request(request("long", "a cat", **{**BASE, "num_inference_steps": 6}, seed=1))
    eng.add_request(request("keep", "a dog", **BASE, seed=2))
    assert {o.request_id for o in eng.step()} == {"long", "keep"}
    eng.abort("long")
    rest = drain(eng)
    assert "long" not in rest and rest["keep"][-1].error is None and eng.stats()["num_requests"] == 0


def test_the_served_model_answers_a_sync_video_with_the_same_clip(tmp_path, references) -> None:
    from tests.support.in_process import served

    body = {"prompt": "a cat walking", "size": "32x32", "num_frames": 5, "num_inference_steps": 3, "seed": 1}
    for app in served(tiny_hunyuan_video15_dir(), "hunyuan", tmp_path):
        response = app.post("/v1/videos/sync", json={**body, "fps": 8})
        assert response.status_code == 200, response.text
        frames = served_media.decode_video(response.content, max_pixels=10**6, max_frames=99, param="v")
        want = media.to_uint8(references["a"][0])
        local = served_media.decode_video(
            media.encode_video(want, 8), max_pixels=10**6, max_frames=99, param="v"
        )
        np.testing.assert_array_equal(frames, local)  # encoded in this process, as the server's
