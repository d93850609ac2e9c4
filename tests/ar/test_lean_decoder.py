"""The engine's lean decoder stack computes the model's own forward, bit for bit."""

from __future__ import annotations

import pytest
import torch

from omnistage.params import SamplingParams
from omnistage.stages.ar.lean_decoder import LeanDecoder
from omnistage.stages.ar.packed_linear import fuse_packed
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run
from tests.ar.test_greedy import workload

pytestmark = pytest.mark.engine


def recorded(decoder, log: list[torch.Tensor]):
    def call(**kwargs):
        out = decoder(**kwargs)
        log.append(out.last_hidden_state.clone())
        return out

    return call


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_lean_decoder_equals_the_models_forward(arch: str) -> None:
    """Every step's last hidden states (prefill chunks and decode rows of up to 16 sequences, through the
    paged cache) are identical with the lean stack and with transformers' forward."""
    prompts, arrivals = workload(seed=1)
    logs: dict[str, list[torch.Tensor]] = {"lean": [], "model": []}
    tokens = {}
    for name in logs:
        engine = make_engine(arch, engine_args={"block_size": 8})
        lean = engine.runner.decoder
        assert isinstance(lean, LeanDecoder)
        engine.runner.decoder = recorded(lean if name == "lean" else engine.model.decoder, logs[name])
        requests = [
            StageRequest(f"r{i}", prompt=p, params=SamplingParams(temperature=0.0, max_tokens=8))
            for i, p in enumerate(prompts)
        ]
        results, _ = run(engine, requests, arrivals)
        tokens[name] = {rid: r.token_ids for rid, r in results.items()}
    assert tokens["lean"] == tokens["model"]
    assert len(logs["lean"]) == len(logs["model"]) > 8
    for lean_rows, model_rows in zip(logs["lean"], logs["model"], strict=True):
        assert torch.equal(lean_rows, model_rows)


def test_fused_packed_linears_equal_the_separate_ones() -> None:
    """q/k/v (and gate/up) through one packed GEMM give each linear's packed output exactly."""
    engine = make_engine("qwen2")
    attn = engine.model.decoder.layers[0].self_attn
    fused = fuse_packed(attn.q_proj, attn.k_proj, attn.v_proj)
    assert fused is not None
    for rows in (1, 8, 37):
        x = torch.randn(1, rows, attn.q_proj.weight.shape[1], generator=torch.Generator().manual_seed(rows))
        with torch.inference_mode():
            parts = fused(x)
            for part, linear in zip(parts, (attn.q_proj, attn.k_proj, attn.v_proj), strict=True):
                assert torch.equal(part, linear(x))


def test_unknown_layers_keep_the_models_forward() -> None:
    """Qwen3 normalises q and k per head, which the lean stack does not: the engine calls the model."""
    engine = make_engine("qwen3")
    assert engine.runner.decoder is engine.model.decoder
