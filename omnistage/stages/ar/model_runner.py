"""Runs one scheduled step: packs every sequence's new tokens into one variable-length batch, makes their
input embeddings and positions, calls the transformers decoder once, and computes logits only for the
rows that pick a next token.

Inputs beyond plain token ids, for models whose stages feed each other (thinker → talker):
- `ARRequest.prompt_embeds` rows replace the token-embedding lookup for the prompt;
- `ARRequest.positions` (1 or 3 rows, multimodal RoPE) position the prompt, and generated token i sits at
  i + rope_delta on every row;
- the engine's step hook `hook(request_inputs, step, embed) -> embed` adjusts the embedding of each
  generated token fed back (step = its index among the generated tokens), e.g. to add the thinker's
  hidden state for that step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from omnistage.stages.ar.attention import METADATA_KWARG, build_metadata
from omnistage.stages.ar.kv_cache import KVStorage
from omnistage.stages.ar.lean_decoder import lean_decoder
from omnistage.stages.ar.loader import LoadedModel
from omnistage.stages.ar.scheduler import ScheduledSeq
from omnistage.stages.ar.sequence import SequenceInputError

StepHook = Callable[[dict[str, Any], int, torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class ForwardResult:
    hidden: torch.Tensor  # [T, H] last-layer hidden states of every packed row
    offsets: list[int]  # first packed row of each scheduled sequence
    logits: torch.Tensor | None  # [S, V] float32, one row per sampling sequence
    sampling: list[ScheduledSeq]


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
    ):
        self.model = model
        self.kv = kv
        self.block_size = block_size
        self.device = device
        self.step_hook = step_hook
        self.position_rows = 3 if uses_mrope(model.config) else 1
        self.decoder = lean_decoder(model.decoder)

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> ForwardResult:
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
        )
        out = self.decoder(
            inputs_embeds=embeds[None],
            position_ids=positions,
            attention_mask=None,
            use_cache=False,
            **{METADATA_KWARG: meta},
        )
        hidden = out.last_hidden_state[0]
        sampling = [item for item in batch if item.samples]
        logits = None
        if sampling:
            rows = [offsets[i] + item.num_tokens - 1 for i, item in enumerate(batch) if item.samples]
            logits = self.model.head(hidden[rows]).float()
        return ForwardResult(hidden=hidden, offsets=offsets, logits=logits, sampling=sampling)

    def _patch_embeddings(self, embeds: torch.Tensor, batch: list[ScheduledSeq], offsets: list[int]) -> None:
        for item, offset in zip(batch, offsets, strict=True):
            seq, start, end = item.seq, item.start, item.start + item.num_tokens
            request = seq.request
            prompt_len = seq.num_prompt_tokens
            if request.prompt_embeds is not None and start < prompt_len:
                stop = min(end, prompt_len)
                embeds[offset : offset + stop - start] = request.prompt_embeds[start:stop]
            if self.step_hook is not None and end > prompt_len:
                for pos in range(max(start, prompt_len), end):
                    row = offset + pos - start
                    try:
                        embeds[row] = self.step_hook(request.inputs, pos - prompt_len, embeds[row])
                    except Exception as exc:  # noqa: BLE001 - a hook failure fails its own request only
                        raise SequenceInputError(seq, exc) from exc

    def _positions(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """[1, T] positions, or [3, 1, T] for multimodal RoPE."""
        parts = []
        for item in batch:
            seq, start, end = item.seq, item.start, item.start + item.num_tokens
            given = seq.request.positions
            if given is None:
                parts.append(torch.arange(start, end).expand(self.position_rows, -1))
                continue
            prompt_len = given.shape[1]
            head = given[:, start : min(end, prompt_len)]
            tail = torch.arange(max(start, prompt_len), end) + seq.request.rope_delta
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
