"""The native pointwise kernels (csrc/decoder_pointwise.cpp) compute what the torch ops they replace do."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from omnistage.stages.ar.cpu import native

pytestmark = pytest.mark.skipif(
    not native.DECODER.runs_here(), reason="they need AVX-512 or AVX2; torch ops run instead"
)

DTYPES = [torch.float32, torch.bfloat16]
EPS = 1e-6


def ops():
    built = native.kernels()
    assert built is not None, "AVX-512/AVX2 CPU, but the kernels did not build (see the log)"
    return built


def rand(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """transformers' Llama/Qwen2 RMSNorm."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return weight * h.to(x.dtype)


def assert_rounding_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to float rounding: a few ulp of float32, or 1 of bfloat16 on at most 1 value in 1000."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=4.8e-7, atol=1e-7)
    else:
        torch.testing.assert_close(got, want, rtol=7.9e-3, atol=1e-5)
        assert (got != want).sum() <= want.numel() // 1000


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "hidden"), [(1, 64), (32, 768), (37, 200), (300, 768)])
def test_rms_norm_and_its_residual_add(dtype: torch.dtype, rows: int, hidden: int) -> None:
    """Widths with and without a 16-lane tail, one row to a long prefill (split across threads)."""
    x, y = rand(1, rows, hidden, dtype=dtype, seed=1), rand(1, rows, hidden, dtype=dtype, seed=2)
    weight = (1 + rand(hidden, dtype=torch.float32, seed=3, scale=0.1)).to(dtype)
    assert_rounding_close(ops().rms_norm(x, weight, EPS), torch_rms_norm(x, weight))
    total, normed = ops().add_rms_norm(x, y, weight, EPS)
    assert torch.equal(total, x + y)
    assert_rounding_close(normed, torch_rms_norm(x + y, weight))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "q_heads", "kv_heads", "dim"), [(32, 12, 4, 64), (5, 4, 2, 16), (9, 2, 1, 40)]
)
def test_rotary_is_bit_identical_to_transformers(
    dtype: torch.dtype, rows: int, q_heads: int, kv_heads: int, dim: int
) -> None:
    """In place on the q and k heads of a packed q/k/v row; v is left alone."""
    qkv = rand(1, rows, (q_heads + 2 * kv_heads) * dim, dtype=dtype, seed=4)
    positions = torch.randint(0, 4000, (1, rows), generator=torch.Generator().manual_seed(5))
    freqs = positions[..., None].float() / 10000 ** (torch.arange(0, dim, 2).float() / dim)
    angles = torch.cat((freqs, freqs), dim=-1)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def heads(part: torch.Tensor) -> torch.Tensor:
        return part.view(1, rows, -1, dim).transpose(1, 2)

    widths = [q_heads * dim, kv_heads * dim, kv_heads * dim]
    q, k, v = qkv.split(widths, dim=-1)
    want_q, want_k = apply_rotary_pos_emb(heads(q), heads(k), cos, sin)
    rotated = qkv.clone()
    ops().rotary_(rotated, cos, sin, q_heads + kv_heads, dim)
    got_q, got_k, got_v = rotated.split(widths, dim=-1)
    assert torch.equal(heads(got_q), want_q)
    assert torch.equal(heads(got_k), want_k)
    assert torch.equal(got_v, v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "width"), [(32, 3072), (3, 40), (300, 2048)])
def test_silu_mul(dtype: torch.dtype, rows: int, width: int) -> None:
    gate_up = rand(1, rows, 2 * width, dtype=dtype, seed=6, scale=3.0)
    gate, up = gate_up.split(width, dim=-1)
    assert_rounding_close(ops().silu_mul(gate_up), F.silu(gate) * up)


def test_bad_arguments_raise() -> None:
    x = rand(4, 32, dtype=torch.float32, seed=7)
    with pytest.raises(RuntimeError, match="share one dtype"):
        ops().rms_norm(x, torch.ones(32, dtype=torch.bfloat16), EPS)
    with pytest.raises(RuntimeError, match="one value per hidden unit"):
        ops().rms_norm(x, torch.ones(31), EPS)
    with pytest.raises(RuntimeError, match="non-empty last dim"):
        ops().rms_norm(torch.ones(4, 0), torch.ones(0), EPS)
    with pytest.raises(RuntimeError, match="contiguous"):
        ops().rms_norm(x.t(), torch.ones(4), EPS)
    with pytest.raises(RuntimeError, match="one shape and dtype"):
        ops().add_rms_norm(x, x[:3], torch.ones(32), EPS)
    with pytest.raises(RuntimeError, match="must fit in a row"):
        ops().rotary_(x, torch.ones(4, 16), torch.ones(4, 16), 3, 16)
    with pytest.raises(RuntimeError, match="one row of dim per row"):
        ops().rotary_(x, torch.ones(3, 16), torch.ones(3, 16), 2, 16)
    with pytest.raises(RuntimeError, match="halves"):
        ops().silu_mul(rand(4, 33, dtype=torch.float32, seed=8))
