"""What the AR engine tracks per request (`ARRequest`) and per generated sequence (`Sequence`).

A request with `n > 1` owns `n` sequences that share its prompt; the scheduler, the cache and the runner
only ever see sequences, so `n` costs nothing anywhere else.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
import sys
from typing import TYPE_CHECKING, Any

import torch

from omnistage.params import SamplingParams

if TYPE_CHECKING:
    from omnistage.stages.ar.detokenizer import IncrementalDetokenizer

_seq_ids = itertools.count()


class SequenceInputError(Exception):
    """Something one sequence brought (its step hook, its logits processor) failed; only its request
    fails, the engine keeps serving the others."""

    def __init__(self, seq: Sequence, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.seq = seq
        self.cause = cause


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass(eq=False)
class ARRequest:
    """One StageRequest as the engine holds it.

    `prompt_embeds` ([L, H]) replaces the token-embedding lookup for the prompt; `positions` ([R, L], R = 1
    or 3 rows of RoPE positions) and `rope_delta` give multimodal positions: a token at index i >= L sits at
    position i + rope_delta on every row (how transformers' multimodal-rotary models continue decoding).
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_time: float
    inputs: Any  # ARInputs (ar_inputs.py): the request's own, grown by streamed chunks
    prompt_embeds: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    rope_delta: int = 0
    logits_processors: list[Any] = dataclasses.field(default_factory=list)
    # Hidden states out: output key (transformers' index as asked, -1 the last layer) → layer index >= 0.
    hidden_layers: dict[int, int] = dataclasses.field(default_factory=dict)
    sequences: list[Sequence] = dataclasses.field(default_factory=list)
    first_output_sent: bool = False
    token_counts: Any = None  # the StageRequest's (outputs.TokenCounts), sent with the first output

    @property
    def finished(self) -> bool:
        return all(s.status is SequenceStatus.FINISHED for s in self.sequences)


@dataclasses.dataclass(eq=False)
class Sequence:
    request: ARRequest
    index: int
    token_ids: list[int]
    max_tokens: int  # output tokens allowed (max_tokens capped by the model length and the cache size)
    detokenizer: IncrementalDetokenizer | None
    generator: torch.Generator | None = None
    seq_id: int = dataclasses.field(default_factory=lambda: next(_seq_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: list[int] = dataclasses.field(default_factory=list)
    # Prefix cache bookkeeping: how many leading blocks carry a hash, and the last one's hash.
    num_hashed_blocks: int = 0
    last_block_hash: int | None = None
    # Tokens whose KV depends only on token ids and positions (so they may be shared through the cache).
    max_cacheable_tokens: int = 0
    output_text: str = ""
    num_text_sent: int = 0
    num_hidden_rows_sent: int = 0
    num_tokens_sent: int = 0
    pending_logprobs: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # The post-sample hook's results (post_sample.py): frames not yet sent, and per generated token the
    # embedding fed back in its place (None: its own token embedding), kept for recompute.
    pending_codes: list[torch.Tensor] = dataclasses.field(default_factory=list)
    fed_embeds: list[torch.Tensor | None] = dataclasses.field(default_factory=list)
    pending_tensors: dict[str, list[torch.Tensor]] = dataclasses.field(default_factory=dict)  # its `tensors`
    # Encoder-decoder models: this sequence's cross-attention K/V per layer (cross_attention.py).
    cross_kv: Any = None
    # Classifier-free guidance (guidance.py): a guided sequence's unconditional twin, and on the twin the
    # sequence it guides. The scheduler holds only the guided one and moves its twin with it.
    guide: Sequence | None = None
    guided: Sequence | None = None
    finish_reason: str | None = None
    finish_sent: bool = False
    stop_reason: str | int | None = None
    # The distinct ids among token_ids[:num_seen], and the same as a tensor (see distinct_token_ids).
    seen: set[int] = dataclasses.field(default_factory=set)
    num_seen: int = 0
    seen_ids: torch.Tensor | None = None

    def distinct_token_ids(self) -> torch.Tensor:
        """Every distinct token id so far, prompt and output, sorted. The repetition penalty
        reads it every step and a talker's prompt is hundreds of tokens: it is updated, not rebuilt."""
        if self.num_seen > len(self.token_ids):
            self.seen, self.num_seen = set(), 0
        if self.num_seen < len(self.token_ids):
            before = len(self.seen)
            self.seen.update(self.token_ids[self.num_seen :])
            self.num_seen = len(self.token_ids)
            if len(self.seen) != before:
                self.seen_ids = None
        if self.seen_ids is None:
            self.seen_ids = torch.tensor(sorted(self.seen), dtype=torch.long)
        return self.seen_ids

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def sort_key(self) -> tuple[int, float, int]:
        """Scheduling order: lower priority value first, then arrival (FCFS), then creation order."""
        return (self.request.priority, self.request.arrival_time, self.seq_id)

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def width(self) -> int:
        """Rows the sequence takes in a step: 2 with its guidance twin."""
        return 1 if self.guide is None else 2

    def cacheable(self, num_tokens: int) -> bool:
        return num_tokens <= self.max_cacheable_tokens


def cacheable_tokens(request: ARRequest, hooks_embed_outputs: bool) -> int:
    """How far a sequence's KV is a pure function of its token ids (and so shareable by prefix hash): not
    past the prompt where a hook changes the generated tokens' embeddings."""
    if request.prompt_embeds is not None or request.positions is not None:
        return 0
    return len(request.prompt_token_ids) if hooks_embed_outputs else sys.maxsize
