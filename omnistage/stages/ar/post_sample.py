"""The post-sample hook: a family's batched callback after each step's sampling.

Multi-codebook talkers sample codebook 0 of a frame with the talker's head, then a
small code-predictor network fills in the other codebooks from the talker's hidden state, and the next step
is fed the sum of the frame's codebook embeddings instead of codebook 0's alone. engine_args
`post_sample_hook` ("module:function", or the callable itself in-process) names
`hook(model: LoadedModel, step: SampledStep) -> PostSample`, called once per step with every sequence that
sampled a token in it (one batched call, so the predictor runs as one batch).

The hook must be a pure function of its arguments (the request's own state lives in `inputs`): the same
token, hidden row, step and inputs give the same result whatever else is in the batch. That is what lets a
failed batch be retried one sequence at a time, so a failure fails only the request it belongs to, and what
makes the fed-back embeddings safe to keep: the engine stores each sequence's `next_embeds` rows, and a
sequence preempted by recompute is refilled from them (the hook is not called again for old tokens).
Positions fed a hook's embedding are never shared through the prefix cache (their KV is no function of the
token ids alone).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class SampledStep:
    """A step's sampled sequences, row i for each."""

    token_ids: torch.Tensor  # [S] long, on the model's device: the sampled tokens (codebook 0 of a frame)
    hidden: torch.Tensor  # [S, H] the last-layer hidden state each token was sampled from
    steps: list[int]  # each token's index among its sequence's generated tokens (0: the first)
    inputs: list[Any]  # each sequence's request ARInputs (streamed chunks joined)
    # each sequence's generated tokens before this one (the tokens the hook chose, where it chose them):
    # what a hook whose rules depend on the sequence's past reads, staying a pure function of its arguments
    histories: list[list[int]] = dataclasses.field(default_factory=list)
    # Classifier-free guidance (guidance.py), in a step where some sequence is guided: [S, H] each row's
    # unconditional twin's hidden state (an unguided row's own), for the hook to combine as its family does
    guide_hidden: torch.Tensor | None = None


@dataclasses.dataclass
class PostSample:
    """What the hook returns; either field may be None."""

    codes: torch.Tensor | None = None  # [S, C - 1]: the frame's other codebooks, emitted as codes [1, C]
    next_embeds: torch.Tensor | None = None  # [S, H]: fed back instead of each sampled token's embedding
    # [S] bool: the frame ends its sequence, as an EOS token would (min_tokens and ignore_eos apply): a
    # family whose stop is a whole frame's (CSM's all-EOS frame), not one token id
    stop: torch.Tensor | None = None
    # A family that picks the whole frame itself from the hidden state (every codebook under its own rules,
    # e.g. a delay pattern across codebooks): `frames` [S, C] is emitted as it is (instead of the sampled
    # token + `codes`), and `token_ids` [S] is the token appended in place of the sampled one (what the
    # step stands for in the sequence: EOS ends it as always)
    frames: torch.Tensor | None = None
    token_ids: torch.Tensor | None = None
    # Family payloads, each [S, ...] (a row per sequence): emitted in the output's `tensors` under the key,
    # a step's rows joined along dim 0, e.g. the continuous audio latents a diffusion head made for a frame;
    # or a list of S entries, each [1, ...] or None where that sequence's step emits none (a step that
    # made no frame)
    tensors: dict[str, torch.Tensor | list[torch.Tensor | None]] = dataclasses.field(default_factory=dict)


PostSampleHook = Callable[[Any, SampledStep], PostSample]
EmbedSpec = tuple[int, torch.dtype, torch.device]  # width, dtype, device
# (frame [1, C], embed [H], whether the frame ends the sequence, the token to append or None: the sampled,
# the family payloads [1, ...] by key)
Row = tuple[torch.Tensor | None, torch.Tensor | None, bool, int | None, dict[str, torch.Tensor]]


def run_hook(
    hook: PostSampleHook, model: Any, step: SampledStep, embed: EmbedSpec
) -> list[Row | BaseException]:
    """Each sequence's (codes frame, next embedding), or the exception that failed it. A failing batch is
    retried a sequence at a time, so one bad request does not fail the others. `embed`: the width, dtype
    and device of the model's input embeddings, which the next embeddings must have."""
    with torch.inference_mode():
        return _run(hook, model, step, embed)


def _run(hook: PostSampleHook, model: Any, step: SampledStep, embed: EmbedSpec) -> list[Row | BaseException]:
    try:
        return _rows(hook(model, step), step, embed)
    except Exception as exc:  # noqa: BLE001 - attributed to its sequences below
        if len(step.steps) == 1:
            return [exc]
        logger.warning("post-sample hook failed on a batch of %d; retrying one by one", len(step.steps))
    results: list[Row | BaseException] = []
    for i in range(len(step.steps)):
        pick = slice(i, i + 1)
        guide = step.guide_hidden[pick] if step.guide_hidden is not None else None
        one = SampledStep(
            step.token_ids[pick],
            step.hidden[pick],
            step.steps[pick],
            step.inputs[pick],
            step.histories[pick],
            guide,
        )
        try:
            results += _rows(hook(model, one), one, embed)
        except Exception as exc:  # noqa: BLE001 - a hook failure fails its own request only
            results.append(exc)
    return results


def _rows(out: PostSample, step: SampledStep, embed: EmbedSpec) -> list[Row]:
    n = len(step.steps)
    if not isinstance(out, PostSample):
        raise TypeError(f"the post-sample hook returned {type(out).__name__}, not PostSample")
    frames: list[torch.Tensor | None] = [None] * n
    embeds: list[torch.Tensor | None] = [None] * n
    tokens: list[int | None] = [None] * n
    if out.token_ids is not None:
        if tuple(out.token_ids.shape) != (n,):
            raise ValueError(
                f"the post-sample hook's token_ids have shape {list(out.token_ids.shape)}, not [{n}]"
            )
        tokens = [int(t) for t in out.token_ids.tolist()]
    if out.frames is not None:
        frames = list(out.frames.reshape(n, -1).to("cpu", torch.long).split(1))
    elif out.codes is not None:
        codes = out.codes.reshape(n, -1).to("cpu", torch.long)
        whole = torch.cat([step.token_ids.cpu()[:, None], codes], dim=1)
        frames = list(whole.split(1))
    if out.next_embeds is not None:
        width, dtype, device = embed
        if tuple(out.next_embeds.shape) != (n, width):
            raise ValueError(
                f"the post-sample hook's next_embeds have shape {list(out.next_embeds.shape)}, expected "
                f"[{n}, {width}]"
            )
        embeds = [row.clone() for row in out.next_embeds.to(device, dtype)]
    stops = [False] * n
    if out.stop is not None:
        if tuple(out.stop.shape) != (n,):
            raise ValueError(f"the post-sample hook's stop has shape {list(out.stop.shape)}, expected [{n}]")
        stops = [bool(v) for v in out.stop.tolist()]
    payloads: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    for key, value in out.tensors.items():
        if len(value) != n:
            raise ValueError(f"the post-sample hook's tensors[{key!r}] has {len(value)} rows, not {n}")
        rows = value.detach().to("cpu").split(1) if isinstance(value, torch.Tensor) else value
        for i, row in enumerate(rows):
            if row is not None:
                payloads[i][key] = row.detach().to("cpu").clone()
    return list(zip(frames, embeds, stops, tokens, payloads, strict=True))
