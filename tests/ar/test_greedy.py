"""Greedy decoding equals transformers `generate`, token for token, under continuous batching."""

from __future__ import annotations

import collections
import logging
import random

import pytest

from omnistage.params import SamplingParams
from omnistage.stages.ar.cpu import native
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import hf_greedy, make_engine, run

pytestmark = pytest.mark.engine

MAX_NEW = 24


def workload(seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """16 prompts of 3..70 tokens (half share a 35-token system prefix) and their arrival steps."""
    rng = random.Random(seed)
    system = [rng.randrange(3, 500) for _ in range(35)]
    prompts = []
    for i in range(16):
        own = [rng.randrange(3, 500) for _ in range(rng.randint(3, 35))]
        prompts.append(system + own if i % 2 else own)
    arrivals = sorted(rng.randrange(0, 12) for _ in range(16))
    return prompts, arrivals


class CountingKernels:
    """The native kernels module, counting the calls made to each kernel."""

    def __init__(self, ops):
        self.ops = ops
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str):
        kernel = getattr(self.ops, name)

        def call(*args, **kwargs):
            self.calls[name] += 1
            return kernel(*args, **kwargs)

        return call


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama", "qwen3_moe"])
@pytest.mark.parametrize("mode", ["prefix_cache", "no_prefix_cache", "preemption"])
def test_greedy_matches_transformers(arch: str, mode: str, kernels: str, monkeypatch, caplog) -> None:
    """`kernels="torch"`: the engine as it runs where the native kernels are not built (torch ops only);
    `kernels="native"`: every native kernel the step uses is seen to run. The decoder path is logged once
    at load, naming what runs."""
    counting = None
    if kernels == "torch":
        monkeypatch.setattr(native, "kernels", lambda: None)
    elif native.kernels() is None:
        pytest.skip("the native kernels are not built on this CPU (neither AVX-512 nor AVX2, or no compiler)")
    else:
        counting = CountingKernels(native.kernels())
        monkeypatch.setattr(native, "kernels", lambda: counting)
    prompts, arrivals = workload()
    deploy = {}
    engine_args = {"enable_prefix_caching": mode != "no_prefix_cache", "block_size": 8}
    if mode == "preemption":
        # 24 usable blocks of 8 tokens: the 16 sequences (up to 94 tokens each) cannot all fit at once
        per_block = (
            engine_args["block_size"] * 2 * 2 * 2 * 16 * 4
        )  # tokens * (k, v) * layers * kv heads * dim * fp32
        deploy["kv_cache_bytes"] = 25 * per_block
    with caplog.at_level(logging.INFO, logger="omnistage.stages.ar.model_runner"):
        engine = make_engine(arch, engine_args=engine_args, **deploy)
    (path,) = [r.getMessage() for r in caplog.records if "AR decoder path" in r.getMessage()]
    layer = type(engine.model.decoder.layers[0]).__name__
    assert f"lean decoder over 2 {layer} layers" in path
    if kernels == "torch":
        assert engine.runner.decoder.native_ops is None
        assert "pointwise on torch ops (the native kernels are not built here); attention: torch SDPA" in path
    else:
        assert "pointwise on native kernels; attention: native paged decode and cache write" in path
    requests = [
        StageRequest(f"r{i}", prompt=p, params=SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
        for i, p in enumerate(prompts)
    ]
    results, _ = run(engine, requests, arrivals)
    for i, p in enumerate(prompts):
        expected = hf_greedy(arch, tuple(p), MAX_NEW)
        assert results[f"r{i}"].token_ids == expected, f"request {i} ({len(p)} prompt tokens)"
        assert results[f"r{i}"].prompt_token_ids == p
    stats = engine.stats()
    assert stats["num_requests"] == 0 and stats["kv_blocks_free"] == stats["kv_blocks_total"]
    if mode == "prefix_cache":
        assert stats["prefix_cache_hits"] > 0
        assert any(results[f"r{i}"].num_cached_tokens > 0 for i in range(1, 16, 2))
    if mode == "no_prefix_cache":
        assert stats["prefix_cache_hits"] == 0
    if mode == "preemption":
        assert stats["num_preemptions"] > 0
    assert stats["peak_running"] > 1
    if counting is not None:
        used = {"paged_decode", "write_cache", "rms_norm", "add_rms_norm", "rotary_"}
        used |= {"silu_mul"} if arch != "qwen3_moe" else set()  # experts run as the model runs them
        assert {name for name, n in counting.calls.items() if n > 0} == used
        assert counting.calls["add_rms_norm"] == 2 * 2 * counting.calls["rms_norm"]  # 2 per layer, 2 layers
