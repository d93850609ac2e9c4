"""Bad requests end with one error output naming the field and the rule; the engine keeps serving."""

from __future__ import annotations

import functools

import pytest

from omnistage.errors import InvalidRequestError
from omnistage.params import DiffusionParams
from omnistage.stages.base import StageRequest
from tests.diffusion.helpers import BASE, drain, input_image, make_engine, request

pytestmark = pytest.mark.engine


@functools.cache
def engine(name: str):
    return make_engine(name, execution="step")


WAN = {**BASE, "num_frames": 5}
CASES = [
    ("tiny-wan21-t2v", {**WAN, "height": 40}, "height", "multiple of 16"),
    ("tiny-wan21-t2v", {**WAN, "width": 24}, "width", "multiple of 16"),
    ("tiny-wan21-t2v", {**WAN, "num_frames": 6}, "num_frames", "4*k+1"),
    ("tiny-wan21-t2v", {**WAN, "true_cfg_scale": 2.0}, "true_cfg_scale", "not supported by WanPipeline"),
    ("tiny-wan21-t2v", {**WAN, "guidance_scale_2": 3.0}, "guidance_scale_2", "not supported"),
    ("tiny-wan21-t2v", {**WAN, "image": [input_image(0)]}, "image", "not accepted by WanPipeline"),
    ("tiny-wan21-t2v", {**WAN, "output_format": "png"}, "output_format", "mp4, tensor"),
    ("tiny-wan21-t2v", {**WAN, "num_inference_steps": 5000}, "num_inference_steps", "<= 1000"),
    ("tiny-wan21-t2v", {**WAN, "height": 4096, "width": 4112}, "height", "<= 16777216 pixels"),
    ("tiny-wan21-t2v", {**WAN, "num_frames": 1029}, "num_frames", "<= 1025"),
    ("tiny-wan21-t2v", {**WAN, "num_outputs": 64}, "num_outputs", "<= 16"),
    (
        "tiny-wan21-t2v",
        {**WAN, "cache": "cache_dit", "cache_options": {"bogus": 1}},
        "cache_options",
        "bogus",
    ),
    (
        "tiny-wan21-t2v",
        {**WAN, "cache": "cache_dit", "cache_options": {"steps_computation_mask": [1, 0, 1]}},
        "cache_options",
        "2 values",
    ),
    (
        "tiny-wan21-t2v",
        {**WAN, "cache": "teacache", "cache_options": {"rel_l1_thresh": 0}},
        "cache_options",
        "> 0",
    ),
    ("tiny-wan21-t2v", {**WAN, "extra": {"generator": None}}, "extra", "'generator' is not allowed"),
    ("tiny-wan21-t2v", {**WAN, "extra": {"not_an_arg": 1}}, "extra", "'not_an_arg' is not allowed"),
    ("tiny-sd3", {**BASE, "num_frames": 5}, "num_frames", "must be 1 for StableDiffusion3Pipeline"),
    ("tiny-sd3", {**BASE, "height": 36}, "height", "multiple of 8"),
    ("tiny-sd3", {**BASE, "output_format": "mp4"}, "output_format", "png, jpeg, webp, tensor"),
    ("tiny-wan22-i2v", {**WAN}, "image", "required by WanImageToVideoPipeline"),
    ("tiny-flux1", {**BASE, "mask": b"not used"}, "mask", "not accepted by FluxPipeline"),
]


@pytest.mark.parametrize(("name", "params", "field", "rule"), CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_invalid_request_names_the_field(name, params, field, rule):
    eng = engine(name)
    eng.add_request(request("bad", "a cat", **params))
    outputs = drain(eng)["bad"]
    assert len(outputs) == 1
    out = outputs[0]
    assert out.finished and out.finish_reason == "error"
    assert out.error_type == "InvalidRequestError"
    assert out.error_param == field
    assert field in out.error and rule in out.error, out.error
    assert eng.stats()["num_requests"] == 0


def test_bad_prompt_and_dict_params():
    eng = engine("tiny-wan21-t2v")
    eng.add_request(StageRequest("p", prompt=123, params=DiffusionParams(**WAN)))
    eng.add_request(StageRequest("d", prompt="a cat", params={**WAN, "height": 33}))
    outs = drain(eng)
    assert outs["p"][0].error_param == "prompt"
    assert outs["d"][0].error_param == "height"


def test_video_model_serves_single_frame_images():
    """num_frames=1 on a video pipeline gives images (the image route may use the Wan demo model)."""
    eng = engine("tiny-wan21-t2v")
    eng.add_request(request("img", "a cat", **{**BASE, "num_frames": 1, "output_format": "png"}, seed=3))
    out = drain(eng)["img"][-1]
    assert out.error is None and out.images is not None
    assert out.images.shape == (1, 32, 32, 3)
    assert str(out.images.dtype) == "torch.uint8"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"height": 0}, "height"),
        ({"num_outputs": 0}, "num_outputs"),
        ({"guidance_scale": -1.0}, "guidance_scale"),
        ({"seed": -5}, "seed"),
        ({"cache": "fastcache"}, "cache"),
        ({"cache_options": {"rel_l1_thresh": 0.1}}, "cache_options"),
        ({"output_format": "gif"}, "output_format"),
    ],
)
def test_params_reject_bad_values_on_construction(kwargs, field):
    with pytest.raises(InvalidRequestError) as info:
        DiffusionParams(**kwargs)
    assert info.value.param == field
