"""Wan's text cross-attention on the collapsed prompt (omnistage/stages/diffusion/text_padding.py says why it
is exact).

Wan pipelines pad every prompt with zero rows up to `max_sequence_length` (512) and attend to all of them.
Collapsed only for text cross-attention: not with an image context (`add_k_proj`, Wan I2V), whose split
assumes the full 512 rows.
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from omnistage.stages.diffusion.text_padding import PromptCollapser


class PaddedPromptProcessor(WanAttnProcessor):
    """Wan's attention processor; text cross-attention runs on the collapsed prompt."""

    def __init__(self) -> None:
        super().__init__()
        self._collapse = PromptCollapser()

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: Any = None,
    ) -> torch.Tensor:
        if attn.add_k_proj is None:
            encoder_hidden_states, attention_mask = self._collapse(
                encoder_hidden_states, attention_mask, self._attention_backend
            )
        return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
