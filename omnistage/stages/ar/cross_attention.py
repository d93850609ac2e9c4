"""Encoder-decoder models on the AR engine: cross-attention to each sequence's own encoder output.

A model whose decoder attends an encoder's output (a speech recogniser) gives its loader's
`LoadedModel.cross_kv`: a function that projects one encoder output ([S, H]) into every decoder layer's
cross-attention keys and values. The engine calls it once per sequence when the request is added
(`encoder_hidden_states` in the request's inputs: one [S, H] tensor for all its sequences, or one per
sequence, e.g. one per audio segment with `n` = the number of segments) and keeps the result with the
sequence, so a decode step never
recomputes it and a preempted sequence recomputes only its self-attention. The runner hands the decoder
a `CrossBatch` under `CROSS_KWARG`; the decoder's cross-attention layers call `cross_attention`.

Self-attention keys of such a model depend on the encoder output (from the second layer on), so its
sequences never share KV blocks through the prefix cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from omnistage.errors import InvalidRequestError

CROSS_KWARG = "omni_cross"
INPUT_KEY = "encoder_hidden_states"
# Per decoder layer: (key, value), each [heads, S, head_dim].
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]
CrossProjection = Callable[[torch.Tensor], LayerKV]


@dataclasses.dataclass
class CrossBatch:
    """The step's sequences in packed order: each one's cross K/V and its rows [offset, offset + length)."""

    kv: list[LayerKV]
    offsets: list[int]
    lengths: list[int]


def encoder_states(inputs: Any, n: int, width: int) -> list[torch.Tensor]:
    """The request's encoder outputs (ARInputs.encoder_hidden_states), one [S, width] tensor per sequence
    (a single one is shared)."""
    value = inputs.encoder_hidden_states
    if value is None:
        raise InvalidRequestError(
            f"this stage's decoder attends an encoder's output: the request needs inputs.{INPUT_KEY}",
            param=INPUT_KEY,
        )
    states = list(value) if isinstance(value, list | tuple) else [torch.as_tensor(value)]
    if len(states) == 1 and states[0].ndim == 3:
        states = list(states[0])
    if len(states) == 1:
        states = states * n
    bad = [tuple(s.shape) for s in states if s.ndim != 2 or s.shape[1] != width or s.shape[0] == 0]
    if len(states) != n or bad:
        raise InvalidRequestError(
            f"{INPUT_KEY} must be one [S, {width}] tensor or n = {n} of them, got {len(states)} "
            f"({bad[0] if bad else 'count'})",
            param=INPUT_KEY,
        )
    return states


def project(
    fn: CrossProjection, states: list[torch.Tensor], dtype: torch.dtype, device: Any
) -> list[LayerKV]:
    """Each distinct encoder output projected once (sequences sharing one share its K/V)."""
    done: dict[int, LayerKV] = {}
    with torch.inference_mode():
        for s in states:
            if id(s) not in done:
                done[id(s)] = fn(s.to(device=device, dtype=dtype))
    return [done[id(s)] for s in states]


def cross_attention(query: torch.Tensor, batch: CrossBatch, layer: int, scale: float | None) -> torch.Tensor:
    """query [T, heads, D] (packed rows) → [T, heads, D], each sequence's rows attending its own keys (no
    mask: every encoder position is visible). One SDPA call per sequence: stacking the sequences' keys would
    copy them every step, which costs more than the calls on CPU."""
    out = torch.empty_like(query)
    for kv, offset, length in zip(batch.kv, batch.offsets, batch.lengths, strict=True):
        key, value = kv[layer]
        q = query[offset : offset + length].transpose(0, 1)  # [heads, length, D]
        o = F.scaled_dot_product_attention(q, key, value, scale=scale)
        out[offset : offset + length] = o.transpose(0, 1)
    return out
