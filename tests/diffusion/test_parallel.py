"""CFG-parallel and Ulysses context parallelism with 2 gloo processes equal the single-process output."""

from __future__ import annotations

import pytest

from tests.diffusion.helpers import BASE, drain, final_tensor, make_engine, request

pytestmark = pytest.mark.e2e
WAN = {**BASE, "num_frames": 5}
REQUESTS = [
    ("cfg", "a cat sitting on a bench", {**WAN, "seed": 1}),
    ("nocfg", "a red fox", {**WAN, "seed": 2, "guidance_scale": 1.0}),
    ("neg", "waves on a shore", {**WAN, "seed": 3, "negative_prompt": "blurry", "num_outputs": 2}),
]


def run(**engine_args):
    """Outputs of REQUESTS; on a parallel stage, also the terminal output of a request asking for caching."""
    timeout = {"parallel_timeout_s": 90} if engine_args else {}
    eng = make_engine("tiny-wan21-t2v", execution="step", **engine_args, **timeout)
    try:
        for rid, prompt, params in REQUESTS:
            eng.add_request(request(rid, prompt, **params))
        if engine_args:
            eng.add_request(request("cached", "a cat", **WAN, cache="teacache"))
        outs = drain(eng)
        rejected = outs.pop("cached", [None])[-1]
        return {rid: final_tensor(o[-1]) for rid, o in outs.items()}, rejected, eng
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def single_process():
    outputs, _, _ = run()
    return outputs


@pytest.mark.parametrize(
    "engine_args", [{"cfg_parallel_size": 2}, {"ulysses_degree": 2}], ids=["cfg", "ulysses"]
)
def test_two_process_parallel_equals_single_process(single_process, engine_args):
    outputs, rejected, eng = run(**engine_args)
    executor = eng.runner.executor
    assert executor.world_size == 2
    assert all(w.poll() is not None for w in executor.workers)  # ranks exited on shutdown
    assert set(outputs) == set(single_process)
    for rid, expected in single_process.items():
        assert (outputs[rid] - expected).abs().max() <= 1e-4, rid
    # Caching decides per request while parallel ranks share batches: refused, naming the field.
    assert rejected.error_type == "InvalidRequestError" and rejected.error_param == "cache"
