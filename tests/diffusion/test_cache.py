"""Step caching per request: cache-dit equals diffusers + cache-dit, TeaCache follows its threshold, and
computed / cached steps are reported in the output's metrics."""

from __future__ import annotations

import cache_dit
import pytest
import torch
from diffusers import DiffusionPipeline

from tests.diffusion.helpers import BASE, drain, final_tensor, make_engine, model_dir, reference, request

pytestmark = pytest.mark.engine
STEPS = 6
WAN = {**BASE, "num_frames": 5, "num_inference_steps": STEPS}
AGGRESSIVE = {"residual_diff_threshold": 10.0, "max_warmup_steps": 1, "max_continuous_cached_steps": 2}


def diffusers_with_cache_dit(options: dict, taylorseer: bool) -> torch.Tensor:
    """A plain pipeline whose transformer carries cache-dit hooks (transformer-only mode)."""
    pipe = DiffusionPipeline.from_pretrained(model_dir("tiny-wan21-t2v"), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    config = cache_dit.DBCacheConfig(
        Fn_compute_blocks=1,
        Bn_compute_blocks=0,
        num_inference_steps=STEPS,
        enable_separate_cfg=True,
        **options,
    )
    calibrator = cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=1) if taylorseer else None
    cache_dit.enable_cache(pipe.transformer, cache_config=config, calibrator_config=calibrator)
    out = pipe(
        prompt="a cat", height=32, width=32, num_frames=5, num_inference_steps=STEPS, max_sequence_length=16,
        generator=torch.Generator().manual_seed(1), output_type="np",
    )  # fmt: skip
    stats = cache_dit.summary(pipe.transformer)[0]
    return torch.as_tensor(out.frames), len(stats.cached_steps)


@pytest.fixture(scope="module")
def uncached():
    return reference("tiny-wan21-t2v", "a cat", seed=1, num_frames=5, num_inference_steps=STEPS)


@pytest.mark.parametrize(
    ("mode", "taylorseer"),
    [("step", False), ("request", False), ("step", True)],
    ids=["step", "request", "taylorseer"],
)
def test_cache_dit_matches_diffusers_with_cache_dit(mode, taylorseer, uncached):
    expected, expected_cached = diffusers_with_cache_dit(AGGRESSIVE, taylorseer)
    options = {**AGGRESSIVE, "enable_taylorseer": True} if taylorseer else AGGRESSIVE
    eng = make_engine("tiny-wan21-t2v", execution=mode)
    eng.add_request(request("c", "a cat", **WAN, seed=1, cache="cache_dit", cache_options=options))
    eng.add_request(request("plain", "a cat", **{**WAN, "height": 48}, seed=1))
    outs = drain(eng)
    cached = outs["c"][-1]
    assert (final_tensor(cached) - expected).abs().max() <= 1e-4
    metrics = cached.metrics
    assert metrics["cache"] == "cache_dit" and metrics["cached_steps"] == expected_cached > 0
    assert metrics["computed_steps"] == STEPS - expected_cached
    assert (final_tensor(cached) - uncached).abs().max() > 1e-3  # it really skipped work
    assert outs["plain"][-1].metrics["cached_steps"] == 0
    if taylorseer:  # the forecast really changes what cached steps add
        assert (final_tensor(cached) - diffusers_with_cache_dit(AGGRESSIVE, False)[0]).abs().max() > 1e-4


def test_cache_dit_fixed_schedule_and_uncached_neighbours(uncached):
    """A static steps mask caches exactly the masked steps; requests without caching in the same engine are
    bit-for-bit unaffected."""
    eng = make_engine("tiny-wan21-t2v", execution="step")
    mask = {
        "steps_computation_mask": [1, 1, 0, 0, 1, 1],
        "steps_computation_policy": "static",
        "max_warmup_steps": 0,
    }
    eng.add_request(request("m", "a cat", **WAN, seed=1, cache="cache_dit", cache_options=mask))
    eng.add_request(request("u", "a cat", **WAN, seed=1))
    outs = drain(eng)
    assert outs["m"][-1].metrics["cached_steps"] == 2
    assert (final_tensor(outs["u"][-1]) - uncached).abs().max() <= 1e-4


def test_teacache_follows_its_threshold(uncached):
    eng = make_engine("tiny-wan21-t2v", execution="step")
    eng.add_request(
        request("never", "a cat", **WAN, seed=1, cache="teacache", cache_options={"rel_l1_thresh": 1e-12})
    )
    eng.add_request(
        request("always", "a cat", **WAN, seed=1, cache="teacache", cache_options={"rel_l1_thresh": 1e9})
    )
    outs = drain(eng)
    never, always = outs["never"][-1], outs["always"][-1]
    assert never.metrics["cached_steps"] == 0
    assert (final_tensor(never) - uncached).abs().max() <= 1e-4
    # The first step fills the cache and the last is always computed; every other step reuses it.
    assert always.metrics["cached_steps"] == STEPS - 2
    assert always.metrics["cfg_cached_steps"] == STEPS - 2
    assert (final_tensor(always) - uncached).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["tiny-flux1", "tiny-sd3", "tiny-qwen-image"])
def test_teacache_on_image_families(name):
    params = {**BASE, "num_inference_steps": 4}
    expected = reference(name, "a cat", seed=2, num_inference_steps=4)
    eng = make_engine(name, execution="step", cache={"backend": "teacache", "rel_l1_thresh": 1e9})
    eng.add_request(request("t", "a cat", **params, seed=2))
    out = drain(eng)["t"][-1]
    assert out.metrics["cache"] == "teacache"  # the stage-wide policy applied
    assert out.metrics["cached_steps"] == 2
    assert final_tensor(out).shape == expected.shape
    assert (final_tensor(out) - expected).abs().max() > 1e-4
