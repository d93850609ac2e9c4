"""Weight-only quantized decoder linears (engine argument `quantization`): the kernels compute with the
weights the quantized copy stands for, a GGUF Q4_1 block survives int4 unchanged, and the engine's greedy
tokens equal transformers' on the same model with those weights put back as floats."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from omnistage.params import SamplingParams
from omnistage.stages.ar.cpu.quantized_linear import QuantizedLinear, WeightOnly, quantize_linears
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import hf_model, make_engine, run

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_quantized_linear_computes_with_its_dequantized_weight(kind, dtype) -> None:
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 128), torch.randn(96), torch.randn(2, 5, 128)
    quantized = WeightOnly.of(weight, kind)
    got = QuantizedLinear(quantized, bias.to(dtype), dtype)(x.to(dtype)).float()
    expected = torch.nn.functional.linear(x, quantized.dequantized(), bias)
    # float32 sums in another order; bf16 rounds the activations, the scales and the output.
    tolerance = 1e-4 if dtype is torch.float32 else 0.05 * expected.abs().max().item()
    assert got.shape == (2, 5, 96)
    assert (got - expected).abs().max().item() <= tolerance
    # and the quantized weight is near the original: half a step at most
    step = quantized.scale if kind == "int8" else quantized.scale.repeat_interleave(quantized.group, 1)
    err = (quantized.dequantized() - weight).abs()
    assert (err <= (step[:, None] if kind == "int8" else step) * 0.5 + 1e-6).all()


def test_a_gguf_q4_1_block_is_kept_exactly_by_int4() -> None:
    """Q4_1 stores `q * d + m` per block of 32; int4 groups of 32 map it onto `(q - 8) * scale + zero`."""
    import gguf

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((64, 128)).astype(np.float32)
    blocks = gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q4_1)
    on_grid = torch.from_numpy(gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_1).copy())
    int4 = WeightOnly.int4(on_grid)
    assert (int4.dequantized() - on_grid).abs().max().item() <= 1e-6 * on_grid.abs().max().item()


def test_quantize_linears_skips_the_head_and_frees_float_weights() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 64))
    head = model[2]
    x = torch.randn(3, 64)
    expected_first = nn.functional.linear(x, WeightOnly.int4(model[0].weight).dequantized(), model[0].bias)
    assert quantize_linears(model, "int4", torch.float32, skip=(head,)) == 1
    assert model[0].weight.numel() == 0 and head.weight.numel() == 32 * 64
    assert torch.allclose(model[0](x), expected_first, atol=1e-4)
    with pytest.raises(ValueError, match="quantization must be one of"):
        quantize_linears(model, "int3", torch.float32)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_greedy_tokens_equal_transformers_with_the_dequantized_weights(kind) -> None:
    """The engine (lean decoder, q/k/v and gate/up joined into one quantized kernel call each, batched
    sequences) against transformers' `generate` on the same model whose decoder linears hold the weights the
    quantized copies stand for."""
    reference = hf_model("llama")
    state = {k: v.clone() for k, v in reference.state_dict().items()}
    try:
        with torch.no_grad():
            for module in reference.model.modules():
                if type(module) is nn.Linear:
                    module.weight.copy_(WeightOnly.of(module.weight, kind).dequantized())
        prompts = [[5, 17, 42, 99, 7], [300, 12, 8], [64, 65, 66, 67, 68, 69, 70, 71, 72]]
        expected = []
        for p in prompts:
            with torch.inference_mode():
                out = reference.generate(
                    torch.tensor([p]), max_new_tokens=12, do_sample=False, attention_mask=None
                )
            expected.append(out[0, len(p) :].tolist())
    finally:
        reference.load_state_dict(state)
    engine = make_engine("llama", engine_args={"quantization": kind})
    assert engine.model.decoder.layers[0].self_attn.q_proj.weight.numel() == 0  # quantized, float freed
    requests = [
        StageRequest(f"r{i}", prompt=p, params=SamplingParams(temperature=0.0, max_tokens=12))
        for i, p in enumerate(prompts)
    ]
    results, _ = run(engine, requests, [0, 1, 3])
    assert [results[f"r{i}"].token_ids for i in range(len(prompts))] == expected


def test_an_unknown_quantization_is_refused() -> None:
    with pytest.raises(Exception, match="quantization"):
        make_engine("llama", engine_args={"quantization": "int3"})
