"""The engine's output equals a plain diffusers pipeline call for the same seed (fp32, max abs diff <= 1e-4):
alone, and inside a batch of 4 mixed requests, in request mode and in step mode (where half the batch joins a
step later), for all five families."""

from __future__ import annotations

import pytest

from tests.diffusion.helpers import (
    BASE,
    FAMILIES,
    TRUE_CFG,
    VIDEO,
    drain,
    final_tensor,
    input_image,
    make_engine,
    reference,
    request,
)

pytestmark = pytest.mark.engine
TOLERANCE = 1e-4


def mixed_requests(name: str) -> list[tuple[str, str, dict]]:
    """Four requests: two that can share a pipeline call, one with its own negative prompt (and true CFG where
    the family has it) and two outputs, one at another resolution."""
    extra = {"num_frames": 5} if name in VIDEO else {}
    negative = {"negative_prompt": "blurry, low quality"}
    if name in TRUE_CFG:
        negative["true_cfg_scale"] = 2.0
    return [
        ("r0", "a cat sitting on a bench", {**extra, "seed": 11}),
        ("r1", "a red fox running through the snowy forest at dawn", {**extra, "seed": 12}),
        ("r2", "waves crashing on a rocky shore", {**extra, **negative, "seed": 13, "num_outputs": 2}),
        ("r3", "a small robot painting", {**extra, "seed": 14, "height": 48}),
    ]


def images_for(name: str, rid: str):
    if name != "tiny-wan22-i2v":
        return None
    return input_image(1 if rid != "r3" else 2)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """(family, {rid: reference output}) — the plain diffusers results, computed once per family."""
    name = request.param
    refs = {}
    for rid, prompt, params in mixed_requests(name):
        refs[rid] = reference(name, prompt, image=images_for(name, rid), **params)
    return name, refs


def submit(engine, name: str, rids: set[str]) -> None:
    for rid, prompt, params in mixed_requests(name):
        if rid in rids:
            image = images_for(name, rid)
            engine.add_request(request(rid, prompt, **{**BASE, **params}, image=[image] if image else None))


@pytest.mark.parametrize("mode", ["request", "step"])
def test_engine_equals_plain_diffusers_call(family, mode):
    name, refs = family
    # step_token_budget 0 (unlimited): requests share forwards, which the CPU default (one per forward) avoids
    engine = make_engine(name, execution=mode, step_token_budget=0)
    submit(engine, name, {"r0"})
    alone = drain(engine)
    assert (final_tensor(alone["r0"][-1]) - refs["r0"]).abs().max() <= TOLERANCE

    if mode == "request":
        submit(engine, name, set(refs))
        outputs = drain(engine)
    else:  # r1 and r3 join after one step: requests at different timesteps share the forward
        submit(engine, name, {"r0", "r2"})
        outputs = {}
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        submit(engine, name, {"r1", "r3"})
        for rid, outs in drain(engine).items():
            outputs.setdefault(rid, []).extend(outs)
    assert set(outputs) == set(refs)
    for rid, ref in refs.items():
        got = final_tensor(outputs[rid][-1])
        assert got.shape == ref.shape, (rid, got.shape, ref.shape)
        assert got.dtype == ref.dtype
        diff = (got - ref).abs().max().item()
        assert diff <= TOLERANCE, f"{name} {mode} {rid}: max abs diff {diff}"
    assert engine.stats()["num_requests"] == 0


def test_request_mode_batches_compatible_requests(family):
    """r0 and r1 share one pipeline call (same batch key); the engine records one generate time for both."""
    name, _ = family
    engine = make_engine(name, execution="request")
    submit(engine, name, {"r0", "r1", "r3"})
    first = engine.step()
    assert sorted(o.request_id for o in first) == ["r0", "r1"]
    assert first[0].metrics["generate_s"] == first[1].metrics["generate_s"]
    rest = drain(engine)
    assert list(rest) == ["r3"]
