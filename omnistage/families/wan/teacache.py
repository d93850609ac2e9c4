"""TeaCache on Wan: its blocks modulate their normalised input with a learned `scale_shift_table` plus the
timestep projection. Where the timestep is per token (Wan2.2 TI2V's `expand_timesteps`, a 4-D projection),
TeaCache measures the raw input instead."""

from __future__ import annotations

import torch

# The transformers built of Wan's `WanTransformerBlock` (diffusers' block registry knows it).
TRANSFORMERS = ("WanTransformer3DModel", "WanVACETransformer3DModel")


def modulated_input(block: torch.nn.Module, hidden: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
    if temb.ndim != 3:
        return hidden
    shift, scale = (block.scale_shift_table + temb.float()).chunk(6, dim=1)[:2]
    return block.norm1(hidden.float()) * (1 + scale) + shift
