"""TeaCache on Qwen-Image: its blocks modulate the image stream with `img_mod` (shift, scale and gate from the
timestep embedding), not with an AdaLayerNormZero `norm1`."""

from __future__ import annotations

import torch

TRANSFORMERS = ("QwenImageTransformer2DModel",)


def modulated_input(block: torch.nn.Module, hidden: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
    modulation = block.img_mod(temb).chunk(2, dim=-1)[0]
    return block._modulate(block.img_norm1(hidden), modulation)[0]
