"""One stream's carried state for a causal codec decoder built from transformers' modules (CSM's Mimi,
Qwen3-Omni's code2wav): decoded chunk after chunk, each layer reads again only what it carries here, so the
chunks cost only their own frames and join into the one-pass waveform."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class CodecStream:
    """What each causal layer will read again of the frames it has seen (a conv's last inputs, a transposed
    conv's last input frames) and the transformer's cache (transformers' `DynamicCache` for its config: a
    sliding-window layer keeps its last `sliding_window - 1` keys and values, and counts the steps before:
    the next step's position)."""

    def __init__(self, transformer_config: Any):
        from transformers import DynamicCache

        self.inputs: dict[nn.Module, torch.Tensor] = {}
        self.cache = DynamicCache(config=transformer_config)

    def carry(self, layer: nn.Module, x: torch.Tensor, width: int, replicate: bool = False) -> torch.Tensor:
        """x [B, C, T] after the `width` inputs `layer` saw last in this stream (at its start, the one-pass
        padding: zeros, or x's first input where the conv pads by replicating), keeping the new last `width`
        for the next chunk."""
        if width == 0:
            return x
        past = self.inputs.get(layer)
        if past is None:
            past = x[..., :1].expand(*x.shape[:-1], width) if replicate else x.new_zeros(*x.shape[:-1], width)
        joined = torch.cat([past, x], dim=-1)
        self.inputs[layer] = joined[..., joined.shape[-1] - width :].clone()
        return joined
