"""Runs one scheduled step: packs every sequence's new tokens into one variable-length batch, makes their
input embeddings and positions, calls the transformers decoder once, and computes logits only for the
rows that pick a next token.

Inputs beyond plain token ids, for models whose stages feed each other (thinker → talker):
- `ARRequest.prompt_embeds` rows replace the token-embedding lookup for the prompt;
- `ARRequest.positions` (1 or 3 rows, multimodal RoPE) position the prompt (and the first generated tokens,
  where a family plans their layout), and a generated token i past them sits at i + rope_delta on every row;
- a generated token's embedding is the one the post-sample hook made for it, where it made one
  (`Sequence.fed_embeds`, post_sample.py), else its token embedding;
- the engine's step hook `hook(request_inputs, step, embed) -> embed` adjusts the embedding of each
  generated token fed back (step = its index among the generated tokens), e.g. to add the thinker's
  hidden state for that step;
- an encoder-decoder model's decoder gets each sequence's cross-attention K/V (cross_attention.py).

Hidden states of other layers than the last come out when asked (`layers`): the lean decoder records them
as it goes, the model's own forward through `output_hidden_states`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from omnistage.stages.ar.attention import METADATA_KWARG, build_metadata
from omnistage.stages.ar.cpu.lean_decoder import LeanDecoder, describe, lean_decoder
from omnistage.stages.ar.cross_attention import CROSS_KWARG, CrossBatch
from omnistage.stages.ar.extra_inputs import extra_forward_kwargs
from omnistage.stages.ar.kv_cache import KVStorage
from omnistage.stages.ar.loader import LoadedModel
from omnistage.stages.ar.scheduler import ScheduledSeq
from omnistage.stages.ar.sequence import SequenceInputError

logger = logging.getLogger(__name__)

StepHook = Callable[[dict[str, Any], int, torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class ForwardResult:
    hidden: torch.Tensor  # [T, H] last-layer hidden states of every packed row
    offsets: list[int]  # first packed row of each scheduled sequence
    logits: torch.Tensor | None  # [S, V] float32, one row per sampling sequence
    sampling: list[ScheduledSeq]
    sampled_hidden: torch.Tensor | None = None  # [S, H] the rows the logits came from
    layers: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)  # layer → [T, H]


def uses_mrope(config: Any) -> bool:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return isinstance(rope, dict) and "mrope_section" in rope


class ModelRunner:
    def __init__(
        self,
        model: LoadedModel,
        kv: KVStorage | None,
        block_size: int,
        device: torch.device,
        step_hook: StepHook | None = None,
        feeds_embeds: bool = False,
        fast_path: bool = True,
    ):
        self.model = model
        self.kv = kv
        self.block_size = block_size
        self.device = device
        self.step_hook = step_hook
        self.feeds_embeds = feeds_embeds  # a post-sample hook may give generated tokens their embeddings
        self.position_rows = 3 if uses_mrope(model.config) else 1
        self.fast_path = fast_path  # the CPU fast path (stages/ar/cpu/): lean decoder and native kernels
        self.decoder = lean_decoder(model.decoder) if fast_path else model.decoder
        # What runs, and why, in words (stats, log).
        self.path = (
            describe(self.decoder, model.decoder) if fast_path else "the model's own forward (fast path off)"
        )
        logger.info("AR decoder path: %s", self.path)

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq], layers: tuple[int, ...] = ()) -> ForwardResult:
        """One forward of `batch`; `layers`: hidden_states indices in [0, num_layers) to return as well."""
        token_ids: list[int] = []
        offsets: list[int] = []
        for item in batch:
            offsets.append(len(token_ids))
            token_ids.extend(item.seq.token_ids[item.start : item.start + item.num_tokens])
        ids = torch.tensor(token_ids, device=self.device)
        embeds = self.model.embed(ids)
        self._patch_embeddings(embeds, batch, offsets)
        positions = self._positions(batch)
        meta = build_metadata(
            self.kv,
            self.block_size,
            [item.start for item in batch],
            [item.num_tokens for item in batch],
            [item.seq.block_table for item in batch],
            self.device,
            native=self.fast_path,
        )
        kwargs: dict[str, Any] = {METADATA_KWARG: meta}
        if self.model.cross_kv is not None:
            kwargs[CROSS_KWARG] = CrossBatch(
                [item.seq.cross_kv for item in batch], offsets, [item.num_tokens for item in batch]
            )
        kwargs.update(extra_forward_kwargs(batch, offsets, len(token_ids), self.device))
        if layers:
            kwargs.update(_layer_kwargs(self.decoder, layers))
        out = self.decoder(
            inputs_embeds=embeds[None], position_ids=positions, attention_mask=None, use_cache=False, **kwargs
        )
        hidden = out.last_hidden_state[0]
        sampling = [item for item in batch if item.samples]
        result = ForwardResult(hidden=hidden, offsets=offsets, logits=None, sampling=sampling)
        if sampling:
            rows = [offsets[i] + item.num_tokens - 1 for i, item in enumerate(batch) if item.samples]
            result.sampled_hidden = hidden[rows]
            result.logits = self._logits(
                result.sampled_hidden, [item.seq.request.inputs.head for item in sampling]
            )
        if layers:
            result.layers = {k: out.hidden_states[k][0] for k in layers}
        return result

    def _logits(self, hidden: torch.Tensor, heads: list[str | None]) -> torch.Tensor:
        """Each row's logits from its request's head (the model's, or one of `heads` by name), padded with
        -inf to the widest where they differ."""
        if not any(heads):
            return self.model.head(hidden).float()
        parts: dict[str | None, list[int]] = {}
        for row, name in enumerate(heads):
            parts.setdefault(name, []).append(row)
        made = {
            name: (self.model.heads[name] if name else self.model.head)(hidden[rows]).float()
            for name, rows in parts.items()
        }
        width = max(m.shape[-1] for m in made.values())
        logits = hidden.new_full((hidden.shape[0], width), float("-inf"), dtype=torch.float32)
        for name, rows in parts.items():
            logits[rows, : made[name].shape[-1]] = made[name]
        return logits

    def _patch_embeddings(self, embeds: torch.Tensor, batch: list[ScheduledSeq], offsets: list[int]) -> None:
        for item, offset in zip(batch, offsets, strict=True):
            seq, start, end = item.seq, item.start, item.start + item.num_tokens
            request = seq.request
            prompt_len = seq.num_prompt_tokens
            if request.prompt_embeds is not None and start < prompt_len:
                stop = min(end, prompt_len)
                embeds[offset : offset + stop - start] = request.prompt_embeds[start:stop]
            if self.feeds_embeds and end > prompt_len:
                self._feed_embeds(embeds, seq, offset, start, end)
            if self.step_hook is not None and end > prompt_len:
                for pos in range(max(start, prompt_len), end):
                    row = offset + pos - start
                    try:
                        embeds[row] = self.step_hook(request.inputs, pos - prompt_len, embeds[row])
                    except Exception as exc:  # noqa: BLE001 - a hook failure fails its own request only
                        raise SequenceInputError(seq, exc) from exc

    @staticmethod
    def _feed_embeds(embeds: torch.Tensor, seq: Any, offset: int, start: int, end: int) -> None:
        """Generated positions in [start, end) take the embeddings the post-sample hook made for them."""
        made, base = seq.fed_embeds, seq.num_prompt_tokens
        for pos in range(max(start, base), min(end, base + len(made))):
            row = made[pos - base]
            if row is not None:
                embeds[offset + pos - start] = row

    def _positions(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """[1, T] positions, or [3, 1, T] for multimodal RoPE."""
        parts = []
        for item in batch:
            seq, start, end = item.seq, item.start, item.start + item.num_tokens
            given = seq.request.positions
            if given is None:
                parts.append(torch.arange(start, end).expand(self.position_rows, -1))
                continue
            planned = given.shape[1]  # the prompt's, and any planned for generated tokens
            head = given[:, start : min(end, planned)]
            tail = torch.arange(min(max(start, planned), end), end) + seq.request.rope_delta
            parts.append(torch.cat([head, tail.expand(given.shape[0], -1)], dim=1))
        positions = torch.cat(parts, dim=1).to(self.device)
        return positions[:, None, :] if self.position_rows == 3 else positions

    # ---- sleep -----------------------------------------------------------------------------------------
    def offload(self) -> None:
        self.model.root.to("cpu")
        self.kv = None

    def restore(self, kv: KVStorage) -> None:
        self.model.root.to(self.device)
        self.kv = kv


def _layer_kwargs(decoder: Any, layers: tuple[int, ...]) -> dict[str, Any]:
    """How `decoder` is asked for hidden states besides the last: the lean decoder records just `layers`;
    a transformers model returns all of them (`hidden_states`, transformers' indexing)."""
    if isinstance(decoder, LeanDecoder):
        return {"hidden_layers": layers}
    return {"output_hidden_states": True}
