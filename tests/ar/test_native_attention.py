"""The native decode-attention kernel (native.py) equals the torch SDPA path it replaces."""

from __future__ import annotations

import pytest
import torch

from omnistage.stages.ar.attention import build_metadata, paged_attention_forward
from omnistage.stages.ar.cpu import native
from omnistage.stages.ar.kv_cache import KVStorage

pytestmark = pytest.mark.skipif(
    not native.DECODER.runs_here(), reason="the kernel needs AVX-512 or AVX2; SDPA runs instead"
)

BLOCK = 8


class Layer(torch.nn.Module):
    layer_idx = 0


def attend(history: list[int], new: list[int], heads: int, kv_heads: int, dim: int, dtype, use_native: bool):
    """One layer's attention for sequences with `history[i]` cached tokens and `new[i]` tokens this step,
    on a cache filled with seeded random keys/values (so both calls see the same inputs)."""
    gen = torch.Generator().manual_seed(0)
    blocks_each = [-(-(h + n) // BLOCK) for h, n in zip(history, new, strict=True)]
    kv = KVStorage(1, 1 + sum(blocks_each) + 3, BLOCK, kv_heads, dim, dtype, "cpu")
    kv.key[0].copy_(torch.randn(kv.key[0].shape, generator=gen))
    kv.value[0].copy_(torch.randn(kv.value[0].shape, generator=gen))
    order = (torch.randperm(len(kv.key[0]) // BLOCK - 1, generator=gen) + 1).tolist()  # block 0 is NULL
    tables, at = [], 0
    for count in blocks_each:
        tables.append(order[at : at + count])
        at += count
    meta = build_metadata(kv, BLOCK, history, new, tables, torch.device("cpu"))
    total = sum(new)
    q = torch.randn(1, heads, total, dim, generator=gen).to(dtype)
    k = torch.randn(1, kv_heads, total, dim, generator=gen).to(dtype)
    v = torch.randn(1, kv_heads, total, dim, generator=gen).to(dtype)
    can_decode = native.can_decode
    try:
        native.can_decode = can_decode if use_native else (lambda *_: False)
        out, _ = paged_attention_forward(Layer(), q, k, v, None, scaling=dim**-0.5, omni_attn=meta)
    finally:
        native.can_decode = can_decode
    return out


def test_the_kernel_builds_on_this_cpu() -> None:
    assert native.kernels() is not None, "AVX-512/AVX2 CPU, but the kernel did not build (see the log)"


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "dtype", "tol"),
    [
        (4, 2, 16, torch.float32, 1e-5),
        (12, 4, 64, torch.float32, 1e-5),
        (8, 8, 128, torch.float32, 1e-5),
        (4, 2, 48, torch.float32, 1e-5),
        (2, 1, 256, torch.float32, 1e-5),
        (12, 4, 64, torch.bfloat16, 2e-2),
        (6, 1, 32, torch.bfloat16, 2e-2),
    ],
)
def test_decode_equals_sdpa(heads: int, kv_heads: int, dim: int, dtype: torch.dtype, tol: float) -> None:
    history = [0, 1, 7, 8, 15, 40, 99, 3]  # 0: a one-token prompt, attending to its own new key only
    new = [1] * len(history)
    expected = attend(history, new, heads, kv_heads, dim, dtype, use_native=False)
    got = attend(history, new, heads, kv_heads, dim, dtype, use_native=True)
    assert got.dtype == dtype and got.shape == expected.shape == (1, sum(new), heads, dim)
    torch.testing.assert_close(got.float(), expected.float(), rtol=tol, atol=tol)


def test_decode_beside_prefill_chunks_equals_sdpa() -> None:
    """A step mixing decoding sequences with prefill chunks: only the decode group takes the kernel."""
    history, new = [5, 0, 30, 12, 16], [1, 9, 1, 4, 1]
    expected = attend(history, new, 4, 2, 16, torch.float32, use_native=False)
    got = attend(history, new, 4, 2, 16, torch.float32, use_native=True)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_bad_indices_raise_instead_of_reading_out_of_bounds() -> None:
    q = torch.randn(2, 4, 16)
    cache = torch.randn(32, 2, 16)
    out = torch.empty_like(q)
    rows, lens = torch.tensor([0, 1]), torch.tensor([3, 2])
    with pytest.raises(RuntimeError, match="cache slot out of range"):
        native.paged_decode(out, q, cache, cache, rows, torch.tensor([[1, 2, 32], [4, 5, 0]]), lens, 0.25)
    with pytest.raises(RuntimeError, match="sequence length out of range"):
        native.paged_decode(out, q, cache, cache, rows, torch.tensor([[1, 2], [4, 5]]), lens, 0.25)
    with pytest.raises(RuntimeError, match="query row out of range"):
        slots = torch.tensor([[1, 2, 3]] * 2)
        native.paged_decode(out, q, cache, cache, torch.tensor([0, 2]), slots, lens, 0.25)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cache_write_equals_index_copy(dtype: torch.dtype) -> None:
    """This step's keys and values, views of a packed q/k/v projection, land in their slots exactly as
    index_copy_ puts them; nothing else in the cache changes; a bad slot raises."""
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim, rows = 4, 2, 16, 5
    fused = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=gen).to(dtype)
    k = fused[:, heads * dim : (heads + kv_heads) * dim].view(rows, kv_heads, dim)
    v = fused[:, (heads + kv_heads) * dim :].view(rows, kv_heads, dim)
    slots = torch.tensor([7, 0, 19, 3, 12])
    caches = [torch.randn(20, kv_heads, dim, generator=gen).to(dtype) for _ in range(2)]
    want = [c.clone().index_copy_(0, slots, new) for c, new in zip(caches, (k, v), strict=True)]
    assert native.can_write_cache(k, caches[0]) and native.can_write_cache(v, caches[1])
    native.write_cache(caches[0], caches[1], slots, k, v)
    assert torch.equal(caches[0], want[0]) and torch.equal(caches[1], want[1])
    with pytest.raises(RuntimeError, match="cache slot out of range"):
        native.write_cache(caches[0], caches[1], torch.tensor([1, 2, 3, 4, 20]), k, v)
    assert not native.can_write_cache(k.transpose(1, 2), caches[0])  # heads not packed: index_copy_ instead
