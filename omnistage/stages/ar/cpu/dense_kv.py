"""Attention over a dense, per-call KV cache, for the lean decoder (lean_decoder.py).

A multi-codebook talker's code predictor runs a small decoder some fifteen times a frame, every sequence
of the batch the same length, each frame from an empty cache. transformers' `DynamicCache` and mask machinery
cost more there than the arithmetic; here each layer's keys and values are concatenated as they come and
attention is one SDPA call (causal only when the cache was empty: the first call of a frame).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

DENSE_KV_KWARG = "dense_kv"


class DenseKV:
    """Each layer's keys and values so far, [S, Hkv, T, D]; a fresh one per run."""

    def __init__(self) -> None:
        self.key: dict[int, torch.Tensor] = {}
        self.value: dict[int, torch.Tensor] = {}


def dense_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query [S, Hq, T, D], key/value [S, Hkv, T, D] → ([S, T, Hq, D],
    None); the call's `dense_kv` keeps the keys and values."""
    cache: DenseKV = kwargs[DENSE_KV_KWARG]
    layer = module.layer_idx
    past = layer in cache.key
    if past:
        if query.shape[2] != 1:
            raise ValueError("a dense KV cache takes one new position a call once it holds any")
        key = torch.cat([cache.key[layer], key], dim=2)
        value = torch.cat([cache.value[layer], value], dim=2)
    cache.key[layer], cache.value[layer] = key, value
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        is_causal=not past and query.shape[2] > 1,
        scale=scaling,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2), None
