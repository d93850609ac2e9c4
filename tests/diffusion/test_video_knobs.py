"""Wan's per-request knobs, step by step: `flow_shift` (its scheduler's shift) and, on the two-expert
Wan2.2, `boundary_ratio` (where the low-noise expert takes over) with `guidance_scale_2` — each equal to
diffusers configured the documented way (a scheduler `from_config(..., flow_shift=...)`, the pipeline's
`boundary_ratio` config) within 1e-4, batched with requests at the defaults; a model without the knob, or a
stage running whole calls, refuses it naming the field."""

from __future__ import annotations

import pytest

from tests.diffusion.helpers import (
    BASE,
    drain,
    final_tensor,
    input_image,
    make_engine,
    plain_pipeline,
    reference,
    request,
)

pytestmark = pytest.mark.engine
TOLERANCE = 1e-4
VIDEO = {**BASE, "num_frames": 5, "num_inference_steps": 4}


def configured_reference(name: str, prompt: str, seed: int, flow_shift=None, boundary_ratio=None, **kw):
    """diffusers' own call with the scheduler's shift and the pipeline's boundary changed for it."""
    pipe = plain_pipeline(name)
    scheduler, boundary = pipe.scheduler, pipe.config.get("boundary_ratio")
    try:
        if flow_shift is not None:
            pipe.scheduler = type(scheduler).from_config(scheduler.config, flow_shift=flow_shift)
        if boundary_ratio is not None:
            pipe.register_to_config(boundary_ratio=boundary_ratio)
        return reference(name, prompt, seed, num_frames=5, num_inference_steps=4, **kw)
    finally:
        pipe.scheduler = scheduler
        pipe.register_to_config(boundary_ratio=boundary)


def test_flow_shift_equals_diffusers_with_a_shifted_scheduler_batched_with_defaults() -> None:
    engine = make_engine("tiny-wan21-t2v")
    engine.add_request(request("shifted", "waves at dusk", seed=3, flow_shift=7.0, **VIDEO))
    engine.add_request(request("default", "a quiet lake", seed=4, **VIDEO))
    outs = drain(engine)
    shifted = configured_reference("tiny-wan21-t2v", "waves at dusk", 3, flow_shift=7.0)
    default = configured_reference("tiny-wan21-t2v", "a quiet lake", 4)
    assert (final_tensor(outs["shifted"][-1]) - shifted).abs().max() <= TOLERANCE
    assert (final_tensor(outs["default"][-1]) - default).abs().max() <= TOLERANCE
    unshifted = configured_reference("tiny-wan21-t2v", "waves at dusk", 3)
    assert (shifted - unshifted).abs().max() > 1e-3  # the knob changes the video


def test_boundary_ratio_moves_the_expert_handover_as_diffusers_does() -> None:
    engine = make_engine("tiny-wan22-i2v")
    image = input_image(1)
    knobs = {"boundary_ratio": 0.5, "guidance_scale": 3.0, "guidance_scale_2": 1.5}
    engine.add_request(request("moved", "a red kite", seed=5, image=[image], **knobs, **VIDEO))
    engine.add_request(request("default", "a red kite", seed=5, image=[image], **VIDEO))
    outs = drain(engine)
    moved = configured_reference("tiny-wan22-i2v", "a red kite", 5, image=image, **knobs)
    default = configured_reference("tiny-wan22-i2v", "a red kite", 5, image=image)
    assert (final_tensor(outs["moved"][-1]) - moved).abs().max() <= TOLERANCE
    assert (final_tensor(outs["default"][-1]) - default).abs().max() <= TOLERANCE
    assert (moved - default).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("name", "engine_args", "knob", "why"),
    [
        ("tiny-flux1", {}, {"flow_shift": 3.0}, "not supported by FluxPipeline"),
        ("tiny-wan21-t2v", {}, {"boundary_ratio": 0.5}, "not supported by WanPipeline"),
        ("tiny-wan21-t2v", {"execution": "request"}, {"flow_shift": 3.0}, "runs whole pipeline calls"),
    ],
)
def test_a_knob_the_stage_cannot_apply_is_refused_naming_it(name, engine_args, knob, why) -> None:
    engine = make_engine(name, **engine_args)
    extra = {"num_frames": 5} if "wan" in name else {}
    engine.add_request(request("r", "a cat", seed=1, **knob, **BASE, **extra))
    out = drain(engine)["r"][-1]
    assert out.error_param == next(iter(knob)) and why in out.error, out.error


def test_params_reject_out_of_range_knobs() -> None:
    from omnistage.params import DiffusionParams

    for bad in ({"flow_shift": 0.0}, {"boundary_ratio": 1.0}, {"boundary_ratio": 0.0}):
        with pytest.raises(Exception, match=next(iter(bad))):
            DiffusionParams(**bad)
