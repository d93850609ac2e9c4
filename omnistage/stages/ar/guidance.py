"""Classifier-free guidance: each sequence of a guided request runs beside an unconditional twin.

A family that decodes from a conditional and an unconditional prediction (Dia's frames, Janus' image tokens)
sets `ARInputs.guidance`: the scale, and what the twin sees instead of the request's own inputs (a
prompt of the same length: pads in place of the text; or an encoder output on a zeroed input). The engine
makes each sequence a twin (`Sequence.guide`) that
- is admitted, scheduled with the same number of tokens, preempted and finished with it (the scheduler
  moves the two as one, so both reach their sampling position in the same step and neither can be left
  behind by preemption);
- is fed the tokens (and post-sample embeddings) its sequence is fed: one frame for both, as the
  references' `generate` repeats the chosen token to both halves of its doubled batch;
- is neither sampled nor emitted: the engine samples its sequence from `uncond + scale * (cond - uncond)`
  (transformers' `ClassifierFreeGuidanceLogitsProcessor`), and a post-sample hook gets the twin's hidden
  state (`SampledStep.guide_hidden`) to combine as its family does.
A pair takes two of `max_num_seqs` and twice its tokens of the step budget.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from omnistage.errors import InvalidRequestError


@dataclasses.dataclass
class Guidance:
    """The unconditional twin's inputs. `prompt_token_ids` None: the request's own ids (and its own
    `inputs_embeds`, unless `inputs_embeds` is given); `encoder_hidden_states`: what a cross-attending
    decoder's twin attends (required for an encoder-decoder model)."""

    scale: float
    prompt_token_ids: list[int] | None = None
    inputs_embeds: torch.Tensor | None = None
    encoder_hidden_states: Any = None


def twin_request(ar: Any, guidance: Guidance, vocab_size: int, hidden_size: int, dtype: torch.dtype) -> Any:
    """The twin's ARRequest: the request's own parameters and inputs (the hooks read the same request
    state), its prompt replaced as `guidance` says; never emits, so no hidden states and no processors."""
    if not isinstance(guidance, Guidance):
        raise InvalidRequestError(
            f"guidance must be a Guidance, got {type(guidance).__name__}", param="guidance"
        )
    if math.isnan(float(guidance.scale)):
        raise InvalidRequestError("guidance.scale must be a number", param="guidance")
    ids = ar.prompt_token_ids if guidance.prompt_token_ids is None else list(guidance.prompt_token_ids)
    if len(ids) != len(ar.prompt_token_ids):
        raise InvalidRequestError(
            f"guidance: the unconditional prompt has {len(ids)} tokens, the request's "
            f"{len(ar.prompt_token_ids)} (the twin decodes in step with its request: same length)",
            param="guidance",
        )
    if any(not 0 <= t < vocab_size for t in ids):
        raise InvalidRequestError(
            f"guidance: prompt token ids must be in [0, {vocab_size})", param="guidance"
        )
    embeds = guidance.inputs_embeds
    if embeds is None and guidance.prompt_token_ids is None:
        embeds = ar.prompt_embeds
    elif embeds is not None:
        embeds = torch.as_tensor(embeds)
        if tuple(embeds.shape) != (len(ids), hidden_size):
            raise InvalidRequestError(
                f"guidance: inputs_embeds must have shape [{len(ids)}, {hidden_size}], "
                f"got {list(embeds.shape)}",
                param="guidance",
            )
        embeds = embeds.to(dtype)
    return dataclasses.replace(
        ar,
        prompt_token_ids=ids,
        prompt_embeds=embeds,
        logits_processors=[],
        hidden_layers={},
        sequences=[],
    )


def guided_logits(logits: torch.Tensor, seqs: list[Any], rows: dict[int, int]) -> torch.Tensor:
    """`logits` [B, V] of a step's sampling rows; each guided sequence's row (seqs[i], its twin's row
    `rows[seq_id]`) becomes uncond + scale * (cond - uncond). Returns the rows of `seqs`."""
    picked = torch.tensor([rows[s.seq_id] for s in seqs])
    out = logits[picked]
    for i, seq in enumerate(seqs):
        twin = seq.guide
        if twin is not None:
            uncond = logits[rows[twin.seq_id]]
            scale = float(seq.request.inputs.guidance.scale)
            out[i] = uncond + (out[i] - uncond) * scale
    return out
