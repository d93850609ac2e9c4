"""Paged attention for a packed variable-length batch, plugged into transformers models.

The engine runs every scheduled token of a step as one sequence of length T (batch 1). Each decoder
layer's attention module calls the function registered here under `ATTENTION_NAME` (through
`transformers.AttentionInterface`) with that layer's projected, rotated query/key/value and the forward's
extra kwargs, where the engine put its `AttentionMetadata` as `omni_attn`. The function writes the new
keys/values into the paged cache at the step's slot mapping and attends each sequence to its own history.

Masks: transformers builds no mask for an attention implementation that has no mask function in
`AttentionMaskInterface` (it returns None early — the path meant for vLLM/TGI-style kernels), so nothing
dense of size T x T is ever built for the packed batch. Causality and sequence boundaries live in the
metadata instead.

Sequences are attended in at most two batched calls per layer: all single-token (decode) queries
together, and all multi-token (prefill chunk) queries together, each padded to its group's longest
length. Torch SDPA does the math, so the same code runs on CPU and on any device SDPA supports; on CPUs
with AVX-512 or AVX2 the decode group instead goes to a native kernel that reads the paged cache in place
(native.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from omnistage.stages.ar.cpu import native
from omnistage.stages.ar.kv_cache import NULL_BLOCK, KVStorage

ATTENTION_NAME = "omnistage_paged"
METADATA_KWARG = "omni_attn"


@dataclasses.dataclass
class AttentionGroup:
    """Sequences attended in one SDPA call. Shapes: B sequences, Q queries (padded), K keys (padded)."""

    query_index: torch.Tensor  # [B, Q] rows of the packed batch
    kv_index: torch.Tensor  # [B, K] cache slots, or packed rows when `kv_from_new`
    mask: torch.Tensor | None  # [B, 1, Q, K] bool, None when `is_causal` or nothing is padded
    is_causal: bool
    kv_from_new: bool  # every sequence starts at position 0: its keys are exactly this step's keys
    out_rows: torch.Tensor  # packed rows the valid queries go to
    valid: torch.Tensor | None  # flat indices of valid queries in [B * Q]; None when all are valid
    kv_len: torch.Tensor  # [B] keys each sequence attends (its first kv_len entries of kv_index)


@dataclasses.dataclass
class AttentionMetadata:
    kv: KVStorage
    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    groups: list[AttentionGroup]
    native: bool = True  # the engine's CPU fast path: the native kernels where they apply


def build_metadata(
    kv: KVStorage,
    block_size: int,
    starts: Seq[int],
    lengths: Seq[int],
    block_tables: Seq[list[int]],
    device: torch.device,
    native: bool = True,
) -> AttentionMetadata:
    """Metadata for sequences whose new tokens are packed in order: sequence i contributes `lengths[i]`
    tokens at positions `starts[i]` onward, with cache blocks `block_tables[i]`."""
    slots: list[int] = []
    for start, n, table in zip(starts, lengths, block_tables, strict=True):
        if n == 1:
            slots.append(table[start // block_size] * block_size + start % block_size)
        else:
            slots.extend(
                table[p // block_size] * block_size + p % block_size for p in range(start, start + n)
            )
    offsets, total = [], 0
    for n in lengths:
        offsets.append(total)
        total += n
    decode = [i for i, n in enumerate(lengths) if n == 1]
    prefill = [i for i, n in enumerate(lengths) if n > 1]
    groups = []
    for members in (decode, prefill):
        if members:
            groups.append(
                _group(
                    [starts[i] for i in members],
                    [lengths[i] for i in members],
                    [offsets[i] for i in members],
                    [block_tables[i] for i in members],
                    block_size,
                    device,
                )
            )
    slot_mapping = torch.tensor(slots, device=device)
    return AttentionMetadata(kv=kv, slot_mapping=slot_mapping, groups=groups, native=native)


def _group(
    starts: list[int],
    lengths: list[int],
    offsets: list[int],
    tables: list[list[int]],
    block_size: int,
    device: torch.device,
) -> AttentionGroup:
    b, q_max = len(lengths), max(lengths)
    start_t = torch.tensor(starts, device=device)
    len_t = torch.tensor(lengths, device=device)
    q_pos = torch.arange(q_max, device=device)
    q_valid = q_pos[None, :] < len_t[:, None]  # [B, Q]
    query_index = torch.tensor(offsets, device=device)[:, None] + torch.where(q_valid, q_pos, 0)
    uniform = min(lengths) == q_max
    out_rows = query_index[q_valid] if not uniform else query_index.reshape(-1)
    valid = None if uniform else q_valid.reshape(-1).nonzero().squeeze(1)

    if max(starts) == 0:  # fresh prompts: keys are this step's keys, causality is the whole mask
        kv_index = query_index
        k_pos = q_pos
        kv_len = len_t
        if uniform:
            return AttentionGroup(query_index, kv_index, None, True, True, out_rows, valid, kv_len)
    else:
        kv_len = start_t + len_t
        k_max = int(kv_len.max())
        width = -(-k_max // block_size)
        table = torch.tensor(
            [t[:width] + [NULL_BLOCK] * (width - len(t[:width])) for t in tables], device=device
        )
        slots = (table[:, :, None] * block_size + torch.arange(block_size, device=device)).reshape(b, -1)
        k_pos = torch.arange(k_max, device=device)
        k_valid = k_pos[None, :] < kv_len[:, None]
        kv_index = torch.where(k_valid, slots[:, :k_max], NULL_BLOCK * block_size)
        if q_max == 1 and int(kv_len.min()) == k_max:
            return AttentionGroup(query_index, kv_index, None, False, False, out_rows, valid, kv_len)
    # query i of sequence b sits at position start_b + i and sees keys j <= that position
    allowed = k_pos[None, None, :] <= (start_t[:, None, None] + q_pos[None, :, None])
    allowed &= k_pos[None, None, :] < kv_len[:, None, None]
    allowed |= ~q_valid[:, :, None] & (k_pos == 0)[None, None, :]  # padded queries see key 0: no NaN rows
    return AttentionGroup(
        query_index, kv_index, allowed[:, None], False, max(starts) == 0, out_rows, valid, kv_len
    )


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention signature: query [1, Hq, T, D], key/value [1, Hkv, T, D] →
    ([1, T, Hq, D], None)."""
    meta: AttentionMetadata = kwargs[METADATA_KWARG]
    layer = module.layer_idx
    new_k = key[0].transpose(0, 1)  # [T, Hkv, D]
    new_v = value[0].transpose(0, 1)
    k_cache, v_cache = meta.kv.key[layer], meta.kv.value[layer]
    fast = meta.native
    if fast and native.can_write_cache(new_k, k_cache) and native.can_write_cache(new_v, v_cache):
        native.write_cache(k_cache, v_cache, meta.slot_mapping, new_k, new_v)
    else:
        k_cache.index_copy_(0, meta.slot_mapping, new_k)
        v_cache.index_copy_(0, meta.slot_mapping, new_v)

    q = query[0].transpose(0, 1)  # [T, Hq, D]
    out = torch.empty_like(q)
    for g in meta.groups:
        if fast and g.query_index.shape[1] == 1 and not g.kv_from_new and native.can_decode(q, k_cache):
            scale = scaling if scaling is not None else q.shape[-1] ** -0.5
            native.paged_decode(out, q, k_cache, v_cache, g.out_rows, g.kv_index, g.kv_len, scale)
            continue
        k_src, v_src = (new_k, new_v) if g.kv_from_new else (k_cache, v_cache)
        o = _attend(g, q, k_src, v_src, scaling)  # [B * Q, Hq, D]
        out.index_copy_(0, g.out_rows, o if g.valid is None else o.index_select(0, g.valid))
    return out.unsqueeze(0), None


def _gather(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows[index] for a 2-D index; index_select on the flat index is many times faster on CPU."""
    return rows.index_select(0, index.reshape(-1)).view(*index.shape, *rows.shape[1:])


def _attend(
    g: AttentionGroup, q: torch.Tensor, k_src: torch.Tensor, v_src: torch.Tensor, scaling: float | None
) -> torch.Tensor:
    b, q_len = g.query_index.shape
    heads, kv_heads, dim = q.shape[1], k_src.shape[1], q.shape[2]
    k = _gather(k_src, g.kv_index).transpose(1, 2)  # [B, Hkv, K, D]
    v = _gather(v_src, g.kv_index).transpose(1, 2)
    q_g = _gather(q, g.query_index)  # [B, Q, Hq, D]
    if q_len == 1:
        # Decode: the query heads sharing a KV head become that head's queries, so no KV is repeated.
        q_g = q_g.view(b, kv_heads, heads // kv_heads, dim)
        o = F.scaled_dot_product_attention(q_g, k, v, attn_mask=g.mask, scale=scaling)
        return o.reshape(b, heads, dim)
    o = F.scaled_dot_product_attention(
        q_g.transpose(1, 2), k, v, attn_mask=g.mask, is_causal=g.is_causal, scale=scaling, enable_gqa=True
    )  # [B, Hq, Q, D]
    return o.transpose(1, 2).reshape(b * q_len, heads, dim)


AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
