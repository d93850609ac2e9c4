"""A frame's residual codebooks from a depth decoder (a "code predictor"): the shape Qwen3-TTS, Qwen3-Omni
and CSM share. The AR stage's head samples codebook 0; this small decoder, fed [the AR hidden state,
codebook 0's embedding] and then each code it makes, gives codebooks 1..G-1 of the frame, one position a
codebook, with a fresh cache per frame. `residual_codes` runs it batched over a step's sequences (the
post-sample hook); `SeededPick` samples each row from its own request's seed."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from omnistage.stages.ar.cpu.dense_kv import DENSE_KV_KWARG, DenseKV, dense_attention_forward
from omnistage.stages.ar.cpu.lean_decoder import LeanDecoder, supports

Pick = Callable[[int, torch.Tensor], torch.Tensor]


def residual_codes(
    model: nn.Module,
    heads: Any,
    embeddings: Any,
    hidden: torch.Tensor,
    code0_embed: torch.Tensor,
    project: nn.Module | None = None,
    pick: Pick | None = None,
    lean: bool = True,
    projects_inside: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A code predictor's frame (Qwen3-TTS and Qwen3-Omni share it): fed [talker hidden, embedding of code
    0] and then each code it makes, `heads[j]` gives code j+1 (a fresh KV cache per frame); `pick(j,
    logits [S, V]) -> codes [S]` chooses each (argmax when None: greedy).
    `heads[j]`, `embeddings[j]`: callables (modules, or a family's slices of one weight).
    `project`: the input projection to the decoder's width; `projects_inside`: the model's own forward
    applies it already (CSM's depth decoder).
    `lean` (where the lean decoder knows the layers): the same layers without transformers' per-call
    machinery, over a dense cache (dense_kv.py); else the model's own forward with a `DynamicCache`.
    Returns (codes [S, G-1], the summed embeddings of codes 1.. [S, H])."""
    decoder = _frame_decoder(model, project) if lean else None
    if decoder is not None:
        run = functools.partial(decoder, **{DENSE_KV_KWARG: DenseKV()})
    else:
        from transformers import DynamicCache

        run = functools.partial(_own_forward, model, None if projects_inside else project, DynamicCache())
    inputs = torch.stack([hidden, code0_embed], dim=1)
    codes, total, start = [], torch.zeros_like(hidden), 0
    for j, head in enumerate(heads):
        positions = torch.arange(start, start + inputs.shape[1], device=hidden.device)
        start += inputs.shape[1]
        out = run(inputs_embeds=inputs, position_ids=positions[None].expand(hidden.shape[0], -1))
        logits = head(out.last_hidden_state[:, -1])
        code = logits.argmax(dim=-1) if pick is None else pick(j, logits)
        embed = embeddings[j](code)
        codes.append(code)
        total = total + embed
        inputs = embed[:, None]
    return torch.stack(codes, dim=1), total


def _own_forward(model: nn.Module, project: nn.Module | None, cache: Any, **kwargs: Any) -> Any:
    inputs = kwargs.pop("inputs_embeds")
    inputs = project(inputs) if project is not None else inputs
    return model(inputs_embeds=inputs, cache=cache, use_cache=True, **kwargs)


def _frame_decoder(model: nn.Module, project: nn.Module | None) -> LeanDecoder | None:
    """The predictor's lean decoder, made once per model and kept on it (after the engine packed its
    linears, so q/k/v and gate/up run as joint GEMMs); None where the lean decoder does not know its
    layers."""
    made = model.__dict__.get("_frame_decoder")
    if made is None and supports(model):
        made = LeanDecoder(model, input_proj=project, attention=dense_attention_forward)
        model.__dict__["_frame_decoder"] = made
    return made


class SeededPick:
    """Per row: greedy, or sampled with the request's temperature / top-k / top-p from a generator seeded by
    (its seed, the frame's step), so a frame's codes depend on nothing else in the batch (the hook stays a
    pure function: batched equals alone, a retry or recompute gives the same codes)."""

    def __init__(self, specs: list[dict[str, Any] | None], steps: list[int], device: torch.device):
        self.specs = specs
        self.generators = [
            None
            if not spec or not spec.get("do_sample", True)
            else torch.Generator(device).manual_seed((int(spec["seed"]) * 1_000_003 + step) % 2**63)
            for spec, step in zip(specs, steps, strict=True)
        ]

    def __call__(self, group: int, logits: torch.Tensor) -> torch.Tensor:
        codes = logits.argmax(dim=-1)
        for i, (spec, gen) in enumerate(zip(self.specs, self.generators, strict=True)):
            if gen is not None:
                codes[i] = _sample(logits[i].float(), spec, gen)
        return codes


def _sample(logits: torch.Tensor, spec: dict[str, Any], gen: torch.Generator) -> torch.Tensor:
    """transformers' order: temperature, top-k, top-p, then a draw from the softmax."""
    logits = logits / max(float(spec.get("temperature", 1.0)), 1e-5)
    top_k = int(spec.get("top_k") or 0)
    if 0 < top_k < logits.shape[-1]:
        logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[-1], float("-inf"))
    top_p = float(spec.get("top_p", 1.0))
    if top_p < 1.0:
        ordered, index = torch.sort(logits, descending=False)
        drop = ordered.softmax(-1).cumsum(-1) <= 1 - top_p
        drop[-1] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, index, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=gen)[0]
