"""The toy talker: a tiny Llama checkpoint whose decoder layers are re-classed as the family's own
(`ToyDecoderLayer` & co.: Llama's arithmetic, another name), behind a decoder that takes the family's extra
input `toy_shift` (rows added to the input embeddings of the prompt positions they are given for)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn
from transformers.models.llama import modeling_llama

from omnistage.stages.ar.cpu.lean_decoder import LeanDecoder, supports
from omnistage.stages.ar.loader import LoadedModel, load_causal_lm


class ToyDecoderLayer(modeling_llama.LlamaDecoderLayer):
    pass


class ToyAttention(modeling_llama.LlamaAttention):
    pass


class ToyRMSNorm(modeling_llama.LlamaRMSNorm):
    pass


class ShiftedDecoder(nn.Module):
    """The model's decoder (or its lean form) with `toy_shift` [1, T, H] added to its input embeddings."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, inputs_embeds: torch.Tensor, toy_shift: torch.Tensor | None = None, **kwargs: Any):
        if toy_shift is not None:
            inputs_embeds = inputs_embeds + toy_shift.to(inputs_embeds.dtype)
        return self.inner(inputs_embeds=inputs_embeds, **kwargs)

    def lean_decoder(self) -> ShiftedLean | None:
        """The lean stack runs the toy layers only where the family registered their form."""
        return ShiftedLean(self.inner) if supports(self.inner) else None


class ShiftedLean(LeanDecoder):
    def __call__(self, inputs_embeds: torch.Tensor, *args: Any, toy_shift: Any = None, **kwargs: Any):
        if toy_shift is not None:
            inputs_embeds = inputs_embeds + toy_shift.to(inputs_embeds.dtype)
        return super().__call__(inputs_embeds, *args, **kwargs)


def load_toy_talker(model_dir: str, dtype: torch.dtype, device: str) -> LoadedModel:
    loaded = load_causal_lm(model_dir, dtype, device)
    model = loaded.decoder
    for layer in model.layers:
        layer.__class__ = ToyDecoderLayer
        layer.self_attn.__class__ = ToyAttention
        layer.input_layernorm.__class__ = ToyRMSNorm
        layer.post_attention_layernorm.__class__ = ToyRMSNorm
    model.norm.__class__ = ToyRMSNorm
    loaded.decoder = ShiftedDecoder(model)
    return loaded


@dataclasses.dataclass
class ToyShift:
    """The talker request's extension (ARInputs.extension): `row` [H], added to every prompt embedding."""

    row: torch.Tensor


def shift_kwargs(batch: list[Any], offsets: list[int], total: int, device: torch.device) -> dict[str, Any]:
    """The extra input's builder: a request's `ToyShift` row [H] on each of its prompt positions in this
    step, zeros elsewhere."""
    shift = None
    for item, offset in zip(batch, offsets, strict=True):
        extension = item.seq.request.inputs.extension
        end = min(item.start + item.num_tokens, item.seq.num_prompt_tokens)
        if not isinstance(extension, ToyShift) or end <= item.start:
            continue
        row = extension.row
        shift = shift if shift is not None else torch.zeros(total, row.shape[0])
        shift[offset : offset + end - item.start] = row
    return {} if shift is None else {"toy_shift": shift[None].to(device)}
