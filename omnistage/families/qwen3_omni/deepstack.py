"""DeepStack on the AR engine: the thinker's vision features join the decoder's hidden states (a request's
`DeepStack` extension, registered as the engine's extra input, stages/ar/extra_inputs.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass
class DeepStack:
    """A thinker request's extension (ARInputs.extension): `embeds` [K, L, H], the residuals of the first K
    decoder layers, and `mask` [L] (bool: the prompt positions they belong to)."""

    embeds: torch.Tensor
    mask: torch.Tensor


def deepstack_kwargs(
    batch: list[Any], offsets: list[int], total: int, device: torch.device
) -> dict[str, Any]:
    """DeepStack (Qwen3-VL-style vision): some prompt rows get a residual added to their hidden states after
    each of the decoder's first K layers. A request carries them as its `DeepStack` extension; the decoder
    takes the step's rows as
    transformers' `visual_pos_masks` [1, T] and `deepstack_visual_embeds` (K tensors [rows, H])."""
    parts = []
    for item, offset in zip(batch, offsets, strict=True):
        deep = item.seq.request.inputs.extension
        if not isinstance(deep, DeepStack):
            continue
        end = min(item.start + item.num_tokens, item.seq.num_prompt_tokens)
        if end > item.start:
            parts.append((offset, deep.mask[item.start : end], deep.embeds, item.start))
    if not parts:
        return {}
    mask = torch.zeros(total, dtype=torch.bool)
    rows: list[list[torch.Tensor]] = []
    for offset, chunk_mask, embeds, start in parts:
        mask[offset : offset + chunk_mask.shape[0]] = chunk_mask
        picked = embeds[:, start : start + chunk_mask.shape[0]][:, chunk_mask]
        rows.append(list(picked))
    if not mask.any():
        return {}
    layers = [torch.cat([r[k] for r in rows]).to(device) for k in range(len(rows[0]))]
    return {"visual_pos_masks": mask[None].to(device), "deepstack_visual_embeds": layers}
