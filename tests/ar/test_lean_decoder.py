"""The engine's lean decoder stack computes the model's own forward: bit for bit on torch ops, to float
rounding through the native pointwise kernels."""

from __future__ import annotations

import logging

import pytest
import torch

from omnistage.params import SamplingParams
from omnistage.stages.ar.cpu import native
from omnistage.stages.ar.cpu.lean_decoder import LeanDecoder
from omnistage.stages.ar.cpu.packed_linear import (
    BATCH_HINT,
    NATIVE_MAX_ROWS,
    PACKED_MAX_ROWS,
    _is_packed,
    _packed_linear,
    native_linear,
    onednn_blocks,
    pack_linears,
)
from omnistage.stages.ar.loader import cpu_has_native
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run, use_pointwise
from tests.ar.test_greedy import workload

pytestmark = pytest.mark.engine


def recorded(decoder, log: list[torch.Tensor]):
    def call(**kwargs):
        out = decoder(**kwargs)
        log.append(out.last_hidden_state.clone())
        return out

    return call


@pytest.mark.parametrize("pointwise", ["torch", "native"])
@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "qwen3_moe"])
def test_lean_decoder_equals_the_models_forward(arch: str, pointwise: str) -> None:
    """Every step's last hidden states (prefill chunks and decode rows of up to 16 sequences, through the
    paged cache) are identical with the lean stack on torch ops and with transformers' forward; through the
    native pointwise kernels (where they are built) they agree to float32 rounding."""
    prompts, arrivals = workload(seed=1)
    logs: dict[str, list[torch.Tensor]] = {"lean": [], "model": []}
    tokens = {}
    for name in logs:
        engine = make_engine(arch, engine_args={"block_size": 8})
        lean = engine.runner.decoder
        assert isinstance(lean, LeanDecoder)
        use_pointwise(lean, pointwise)
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
        if pointwise == "torch":
            assert torch.equal(lean_rows, model_rows)
        else:
            torch.testing.assert_close(lean_rows, model_rows, rtol=1e-5, atol=1e-5)


def test_fused_packed_linears_equal_the_separate_ones() -> None:
    """q/k/v (and gate/up) through one joint GEMM give exactly what each linear's own weight gives through
    the same kernel (the native one up to NATIVE_MAX_ROWS, where built; oneDNN's packed one above, a long
    prefill's too unless no oneDNN copy is kept: then each linear's own weight through the plain GEMM); the
    linears' forwards
    (the model's own path) take their part of it, and every packed result equals oneDNN's bit for bit."""
    engine = make_engine("qwen2")  # its lean decoder has fused every layer's q/k/v and gate/up
    layer = engine.model.decoder.layers[0]
    groups = [
        (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
        (layer.mlp.gate_proj, layer.mlp.up_proj),
    ]
    lean_layer = engine.runner.decoder.layers[0]
    qkv, gate_up = lean_layer.qkv, lean_layer.gate_up
    for joint, linears in zip((qkv, gate_up), groups, strict=True):
        for rows in (1, 8, NATIVE_MAX_ROWS, NATIVE_MAX_ROWS + 1, 37, PACKED_MAX_ROWS):
            gen = torch.Generator().manual_seed(rows)
            x = torch.randn(1, rows, linears[0].weight.shape[1], generator=gen)
            with torch.inference_mode():
                parts = joint(x)
                for part, linear in zip(parts, linears, strict=True):
                    alone = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), BATCH_HINT)
                    weight = linear.weight.detach()
                    few_rows = native_linear(weight, linear.bias)
                    built = native.weight_only_kernels() is not None
                    assert (few_rows is not None) == (built and onednn_blocks(weight.shape[1]) is not None)
                    assert torch.equal(part, _packed_linear(alone, weight, linear.bias, few_rows, x))
                    assert torch.equal(part, linear(x))
                    onednn = _packed_linear(alone, weight, linear.bias, None, x)
                    if rows <= NATIVE_MAX_ROWS and few_rows is not None:
                        assert torch.equal(part, few_rows(x))
                        assert torch.equal(part, onednn)
                    elif rows < PACKED_MAX_ROWS or joint.packed is not None:
                        assert torch.equal(part, onednn)  # a long prefill too, where oneDNN's copy is kept
                    else:
                        assert torch.equal(part, torch.nn.functional.linear(x, weight, linear.bias))


@pytest.mark.skipif(native.weight_only_kernels() is None, reason="the native kernels need an AVX2 CPU")
def test_native_float32_linears_sum_as_onednn_does() -> None:
    """Below a long prefill a packed float32 linear takes the native kernel: x @ W.T + b to float32 rounding
    (float64 reference) and bit for bit what oneDNN's packed GEMM gives on this CPU, bias or not, on one
    thread or two, for every row tile (4 at a time, then 3..1), an output width not a multiple of its 8
    lanes, and input widths across oneDNN's blocks (one, two, three and a part of 1024; 512's); a row's
    result is the same alone as in the batch wherever oneDNN sums one row as it sums several (on AVX2
    always). On AVX2 the blocks it finds are 1024 k (on an AVX-512 Zen 4, measured: the whole of K up to
    512, then 512 for one row, and 512 / 1024 for more rows with K up to / over 1024)."""
    gen = torch.Generator().manual_seed(0)
    kernels = native.weight_only_kernels()
    threads = torch.get_num_threads()
    capability = torch.backends.cpu.get_cpu_capability()
    shapes = ((40, 8), (96, 77), (700, 24), (1024, 24), (2100, 96), (3072, 72), (2100, 13))
    try:
        for k, n in shapes:
            layer = torch.nn.Linear(k, n)
            torch.nn.init.normal_(layer.weight, generator=gen)
            torch.nn.init.normal_(layer.bias, generator=gen)
            onednn = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), BATCH_HINT)
            assert pack_linears(layer) == 1
            blocks = onednn_blocks(k)
            native_here = native_linear(layer.weight.detach(), layer.bias) is not None
            assert native_here == ((n > 64 or k <= 1024) and blocks is not None)  # else oneDNN's own
            if capability == "AVX2":
                assert blocks == (1024, 1024)
            for rows in (*range(1, 10), 16, 37, PACKED_MAX_ROWS - 1):
                x = torch.randn(rows, k, generator=gen)
                for num_threads in (1, 2):
                    torch.set_num_threads(num_threads)
                    with torch.inference_mode():
                        got = layer(x)
                        alone = torch.cat([layer(x[i : i + 1]) for i in range(rows)])
                        want = torch.ops.mkldnn._linear_pointwise(x, onednn, layer.bias, "none", [], "")
                    exact = (x.double() @ layer.weight.double().T + layer.bias.double()).float()
                    assert (got - exact).abs().max().item() <= 1e-5 * exact.abs().max().item(), (k, rows)
                    assert torch.equal(got, want), (k, n, rows, num_threads)
                    if native_here and rows <= NATIVE_MAX_ROWS and blocks[0] == blocks[1]:
                        assert torch.equal(got, alone), (k, rows)
    finally:
        torch.set_num_threads(threads)
    weights = [torch.randn(m, 64, generator=gen) for m in (5, 9, 3)]
    bias = torch.randn(17, generator=gen)
    x = torch.randn(4, 64, generator=gen)
    joint = native_linear(torch.cat(weights), bias)(x)
    separate = [native_linear(w, b)(x) for w, b in zip(weights, bias.split([5, 9, 3]), strict=True)]
    assert torch.equal(joint, torch.cat(separate, dim=-1))
    with pytest.raises(RuntimeError, match="packed by pack_float"):
        kernels.float_linear(x, weights[0], 5, None, 1024)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        kernels.float_linear(x[:, :32], kernels.pack_float(weights[0]), 5, None, 1024)
    with pytest.raises(RuntimeError, match="block_k"):
        kernels.float_linear(x, kernels.pack_float(weights[0]), 5, None, 48)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_linears_are_packed_exactly_where_the_cpu_computes_them_natively(dtype: str) -> None:
    """A bf16 / fp16 engine packs its linears (head, and q/k/v and gate/up through their joint GEMM) on a CPU
    with native support for the type and leaves them alone elsewhere; packed or not, each computes its own
    F.linear, long inputs included (half types keep the packed GEMM at every size)."""
    engine = make_engine("qwen2", dtype=dtype)
    native = cpu_has_native(getattr(torch, dtype))
    layer = engine.model.decoder.layers[0]
    assert engine.model.head.weight.dtype == getattr(torch, dtype)
    assert _is_packed(engine.model.head) == native
    assert _is_packed(layer.mlp.down_proj) == native
    assert ("forward" in layer.self_attn.q_proj.__dict__) == native  # its part of the joint q/k/v GEMM
    for linear in (engine.model.head, layer.self_attn.q_proj, layer.mlp.up_proj, layer.mlp.down_proj):
        for rows in (1, 8, 37, PACKED_MAX_ROWS + 44):
            gen = torch.Generator().manual_seed(rows)
            x = torch.randn(1, rows, linear.weight.shape[1], generator=gen).to(getattr(torch, dtype))
            with torch.inference_mode():
                got = linear(x).float()
                want = torch.nn.functional.linear(x, linear.weight, linear.bias).float()
            torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1e-2)


def test_unknown_layers_keep_the_models_forward(caplog) -> None:
    """A layer type no family registered a form for (here Qwen3-MoE's, renamed) keeps the model's own
    forward, and the log line at load says so and why."""
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    class OtherDecoderLayer(modeling_qwen3_moe.Qwen3MoeDecoderLayer):
        pass

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(modeling_qwen3_moe, "Qwen3MoeDecoderLayer", OtherDecoderLayer)
        with caplog.at_level(logging.INFO, logger="omnistage.stages.ar.model_runner"):
            engine = make_engine("qwen3_moe")
    assert engine.runner.decoder is engine.model.decoder
    lines = [r.getMessage() for r in caplog.records if "AR decoder path" in r.getMessage()]
    assert len(lines) == 1
    assert "the model's own forward" in lines[0]
    assert "OtherDecoderLayer has no registered layer form" in lines[0]
