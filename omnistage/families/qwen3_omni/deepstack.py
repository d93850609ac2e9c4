"""DeepStack on the AR engine: the thinker's vision features join the decoder's hidden states (registered as
the engine's extra input `deepstack_embeds`, stages/ar/extra_inputs.py)."""

from __future__ import annotations

from typing import Any

import torch


def deepstack_kwargs(
    batch: list[Any], offsets: list[int], total: int, device: torch.device
) -> dict[str, Any]:
    """DeepStack (Qwen3-VL-style vision): some prompt rows get a residual added to their hidden states after
    each of the decoder's first K layers. A request carries them as inputs `deepstack_embeds` [K, L, H] and
    `deepstack_mask` [L] (bool: the prompt positions they belong to); the decoder takes the step's rows as
    transformers' `visual_pos_masks` [1, T] and `deepstack_visual_embeds` (K tensors [rows, H])."""
    parts = []
    for item, offset in zip(batch, offsets, strict=True):
        inputs = item.seq.request.inputs
        if "deepstack_embeds" not in inputs:
            continue
        end = min(item.start + item.num_tokens, item.seq.num_prompt_tokens)
        if end > item.start:
            parts.append(
                (offset, inputs["deepstack_mask"][item.start : end], inputs["deepstack_embeds"], item.start)
            )
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
