"""Weight-only quantized linears (engine argument `quantization`): the kernels compute with the weights the
quantized blocks stand for, GGUF's Q4_0 / Q4_1 / Q8_0 blocks are read as they are (and survive a float
round trip through int4 / int8), and the engine's greedy tokens equal transformers' on the same weights as
floats: a float checkpoint quantized on load, and a GGUF served with its own blocks (the default)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from omnistage.families.llm.gguf import converted_dir
from omnistage.families.llm.gguf_blocks import read_blocks
from omnistage.families.llm.tiny_gguf import tiny_gguf_file
from omnistage.params import SamplingParams
from omnistage.stages.ar.cpu import native
from omnistage.stages.ar.cpu.quantized_linear import (
    GROUP,
    QuantizedLinear,
    WeightOnly,
    kernel_path,
    pack_nibbles,
    quantize_linears,
)
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import hf_model, make_engine, run

pytestmark = pytest.mark.engine
NATIVE = native.weight_only_kernels() is not None
needs_native = pytest.mark.skipif(not NATIVE, reason="the weight-only kernels need an AVX2 CPU")
PROMPTS = [[5, 17, 42, 99, 7], [300, 12, 8], [64, 65, 66, 67, 68, 69, 70, 71, 72]]


@needs_native
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_native_kernel_equals_the_dequantized_matmul_for_every_batch_shape(kind) -> None:
    """Rows 1..19 take every row-block of the kernel (8 rows at a time, then 7..1), an odd number of output
    features the one-feature tail; float64 reference."""
    torch.manual_seed(0)
    weight = WeightOnly.of(torch.randn(77, 4 * GROUP), kind)
    linear = QuantizedLinear(weight, None, torch.float32)
    assert linear.path == "native"
    for rows in range(1, 20):
        x = torch.randn(rows, 4 * GROUP)
        expected = (x.double() @ weight.dequantized().double().T).float()
        assert (linear(x) - expected).abs().max().item() <= 1e-5 * expected.abs().max().item(), rows
    kernels = native.weight_only_kernels()
    with pytest.raises(RuntimeError, match="multiple of 32"):
        kernels.int8_linear(torch.randn(2, 48), torch.zeros(3, 48, dtype=torch.int8), torch.ones(3, 1))
    with pytest.raises(RuntimeError, match="contiguous float32"):
        kernels.int8_linear(
            torch.randn(2, 64).double(), torch.zeros(3, 64, dtype=torch.int8), torch.ones(3, 2)
        )


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kernels", ["as built", "none"])
def test_a_quantized_linear_computes_with_its_dequantized_weight(kind, dtype, kernels, monkeypatch) -> None:
    """Every kernel path (native, torch's int4, the dequantized fallback where no kernel applies)."""
    if kernels == "none":
        monkeypatch.setattr(native, "weight_only_kernels", lambda: None)
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 128), torch.randn(96), torch.randn(2, 5, 128)
    quantized = WeightOnly.of(weight, kind)
    linear = QuantizedLinear(quantized, bias.to(dtype), dtype)
    assert linear.path == kernel_path(kind, dtype)
    got = linear(x.to(dtype)).float()
    expected = torch.nn.functional.linear(x, quantized.dequantized(), bias)
    # float32 sums in another order; bf16 rounds the activations, the scales and the output.
    tolerance = 1e-4 if dtype is torch.float32 else 0.05 * expected.abs().max().item()
    assert got.shape == (2, 5, 96)
    assert (got - expected).abs().max().item() <= tolerance
    # and the quantized weight is near the original: half a step of its group at most
    step = quantized.scale.repeat_interleave(GROUP, 1)
    assert ((quantized.dequantized() - weight).abs() <= step * 0.5 + 1e-6).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_inputs_compute_with_the_dense_copy_and_short_ones_with_the_blocks(dtype) -> None:
    """`quantized_dense_rows`: inputs of that many rows or more compute with oneDNN on the dequantized weight
    in the compute dtype (bit for bit what a dense linear of that weight gives), fewer through the
    weight-only kernel; where oneDNN would emulate the dtype no copy is kept."""
    from omnistage.stages.ar.loader import cpu_has_native

    torch.manual_seed(0)
    quantized = WeightOnly.of(torch.randn(96, 128), "int4")
    bias = torch.randn(96).to(dtype)
    dense = QuantizedLinear(quantized, bias, dtype, dense_rows=4)
    plain = QuantizedLinear(quantized, bias, dtype)
    if dtype is torch.bfloat16 and not cpu_has_native(dtype):
        assert dense.dense is None
        return
    packed = torch.ops.mkldnn._reorder_linear_weight(quantized.dequantized().to(dtype), 32)
    for rows in (1, 3, 4, 9, 40):
        x = torch.randn(rows, 128).to(dtype)
        want = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "") if rows >= 4 else plain(x)
        assert torch.equal(dense(x), want), rows
    close = torch.nn.functional.linear(x.float(), quantized.dequantized(), bias.float())
    assert (dense(x).float() - close).abs().max() <= (
        1e-4 if dtype is torch.float32 else 0.05
    ) * close.abs().max()


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_are_read_as_they_are_and_survive_the_float_round_trip(type_name) -> None:
    """`read_blocks` stands for what llama.cpp's reader dequantizes; Q4_1 and Q8_0 floats quantize back to
    the same blocks (llama.cpp makes them from each group's min/max and largest magnitude, as int4 and int8
    do)."""
    import gguf

    kind = gguf.GGMLQuantizationType[type_name]
    weight = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    data = gguf.quants.quantize(weight, kind)
    floats = torch.from_numpy(gguf.quants.dequantize(data, kind).copy())
    blocks = read_blocks(type_name, data)
    tolerance = 1e-6 * floats.abs().max().item() if type_name == "Q4_0" else 0.0  # d * (q - 8) vs q * d - 8d
    assert (blocks.dequantized() - floats).abs().max().item() <= tolerance
    if type_name != "Q4_0":
        again = WeightOnly.of(floats, blocks.kind)
        assert torch.equal(again.q, blocks.q) and torch.equal(again.scale, blocks.scale)
    nibbles = pack_nibbles(blocks.q) if blocks.kind == "int4" else None
    if nibbles is not None:  # the kernel's byte order is the file's
        width = 18 if type_name == "Q4_0" else 20
        assert np.array_equal(nibbles.numpy().reshape(64, -1, 16), data.reshape(64, -1, width)[..., -16:])
    assert read_blocks("Q4_K", data) is None


def test_quantize_linears_skips_the_head_and_frees_float_weights() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64))
    head = model[2]
    x = torch.randn(3, 64)
    expected_first = nn.functional.linear(x, WeightOnly.int4(model[0].weight).dequantized(), model[0].bias)
    assert quantize_linears(model, "int4", torch.float32, skip=(head,)) == 1
    assert model[0].weight.numel() == 0 and head.weight.numel() == 32 * 64
    assert torch.allclose(model[0](x), expected_first, atol=1e-4)
    assert quantize_linears(nn.Sequential(nn.Linear(64, 32)), "auto", torch.float32) == 0  # no blocks: floats
    with pytest.raises(ValueError, match="quantization must be one of"):
        quantize_linears(model, "int3", torch.float32)


def greedy_reference(reference: nn.Module, max_tokens: int) -> list[list[int]]:
    expected = []
    for p in PROMPTS:
        with torch.inference_mode():
            out = reference.generate(
                torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False, attention_mask=None
            )
        expected.append(out[0, len(p) :].tolist())
    return expected


def engine_greedy(engine, max_tokens: int) -> list[list[int]]:
    requests = [
        StageRequest(f"r{i}", prompt=p, params=SamplingParams(temperature=0.0, max_tokens=max_tokens))
        for i, p in enumerate(PROMPTS)
    ]
    results, _ = run(engine, requests, [0, 1, 3])
    return [results[f"r{i}"].token_ids for i in range(len(PROMPTS))]


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_greedy_tokens_equal_transformers_with_the_dequantized_weights(kind) -> None:
    """The engine (lean decoder, q/k/v and gate/up joined into one quantized kernel call each, batched
    sequences) against transformers' `generate` on the same model whose decoder linears hold the weights the
    quantized copies stand for."""
    reference = hf_model("llama")  # shared: its weights are put back after
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    try:
        with torch.no_grad():
            for module in reference.model.modules():
                if type(module) is nn.Linear:
                    module.weight.copy_(WeightOnly.of(module.weight, kind).dequantized())
        expected = greedy_reference(reference, 12)
    finally:
        reference.load_state_dict(state)
    engine = make_engine("llama", engine_args={"quantization": kind})
    assert engine.model.decoder.layers[0].self_attn.q_proj.weight.numel() == 0  # quantized, float freed
    assert engine_greedy(engine, 12) == expected


def test_a_gguf_serves_with_its_own_blocks_and_answers_as_its_float_weights() -> None:
    """By default (`auto`) every linear of a Q4_1 GGUF, the tied head included, computes with the file's
    blocks; greedy tokens equal transformers' on the converted float weights, and `none` computes with
    those floats and answers the same, as does `quantized_dense_rows` (dense copies for longer inputs)."""
    from transformers import AutoModelForCausalLM

    model_dir = converted_dir(tiny_gguf_file())
    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    expected = greedy_reference(reference, 16)
    layers = reference.config.num_hidden_layers
    engine = make_engine(model_dir=str(model_dir))
    path = kernel_path("int4", torch.float32)
    # the tiny file's head is Q4_1 too (its embeddings' width is 64)
    assert engine.stats()["weight_only_linears"] == {f"int4 ({path})": 7 * layers + 1}
    assert engine.model.embed.weight.numel() > 0  # the tied embeddings keep their float table
    assert engine_greedy(engine, 16) == expected
    plain = make_engine(model_dir=str(model_dir), engine_args={"quantization": "none"})
    assert plain.stats()["weight_only_linears"] == {}
    assert engine_greedy(plain, 16) == expected
    # prefills and batched steps (2 rows or more) on dense copies of the blocks' weights: the same answers
    dense = make_engine(model_dir=str(model_dir), engine_args={"quantized_dense_rows": 2})
    assert dense.stats()["weight_only_linears"] == {f"int4 ({path}; dense from 2 rows)": 7 * layers + 1}
    assert engine_greedy(dense, 16) == expected


def test_an_unknown_quantization_is_refused() -> None:
    with pytest.raises(Exception, match="quantization"):
        make_engine("llama", engine_args={"quantization": "int3"})
