"""Which sequences run this step, and with how many tokens.

One unified token budget per step (`max_num_batched_tokens`) covers decodes and prefill chunks alike, as
in vLLM v1: running sequences go first (each needs one token, or the rest of its prefill), then waiting
sequences are admitted while the budget, `max_num_seqs` and the KV cache allow; a prompt longer than the
remaining budget is prefilled in chunks over several steps. Order is FCFS, or (priority, arrival) with
the "priority" policy. When a running sequence needs a block and none is free, the sequence that comes
last in that order is preempted by recompute: its blocks are freed and it waits to be prefilled again
(its full blocks usually survive in the prefix cache, so recomputing is cheap).

A sequence whose per-step inputs stream in (a talker fed the thinker's reply as it is written) may be
unable to compute its next position yet: `ready(seq, position)` says whether it can, and such a sequence
sits out the step, keeping its place and its blocks, until its input arrives.

A sequence with a classifier-free-guidance twin (`Sequence.guide`, guidance.py) is held here alone: its
twin is admitted, scheduled (same start, same number of tokens), preempted and finished with it.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Callable

from omnistage.errors import ConfigError
from omnistage.stages.ar.kv_cache import BlockManager
from omnistage.stages.ar.sequence import Sequence, SequenceStatus

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ScheduledSeq:
    seq: Sequence
    start: int  # first position computed this step
    num_tokens: int

    @property
    def samples(self) -> bool:
        """The step reaches the sequence's last token, so its logits pick the next one."""
        return self.start + self.num_tokens == self.seq.num_tokens


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        policy: str = "fcfs",
        ready: Callable[[Sequence, int], bool] | None = None,
    ):
        if policy not in ("fcfs", "priority"):
            raise ConfigError(f"scheduling_policy must be 'fcfs' or 'priority', got {policy!r}")
        if max_num_batched_tokens < max_num_seqs:
            raise ConfigError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                f"({max_num_seqs}): every running sequence needs one token of each step's budget"
            )
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.ready = ready
        self.waiting: list[Sequence] = []  # kept sorted by `_key`
        self.running: list[Sequence] = []  # kept sorted by `_key`
        self.num_preemptions = 0

    def _key(self, seq: Sequence) -> tuple:
        priority, arrival, seq_id = seq.sort_key
        return (priority if self.policy == "priority" else 0, arrival, seq_id)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=self._key)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        batch: list[ScheduledSeq] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._computable(
                seq,
                seq.num_computed_tokens,
                min(seq.num_tokens - seq.num_computed_tokens, budget // seq.width),
            )
            if n == 0:  # waiting for its input (or the budget left is under its pair's): it keeps its place
                i += 1
                continue
            while not self._can_append(seq, n):
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # `seq` preempted itself; the next sequence now sits at index i
            batch += self._run(seq, seq.num_computed_tokens, n)
            budget -= n * seq.width
            i += 1
        if not preempted:
            budget = self._admit(batch, budget)
        return batch

    def _admit(self, batch: list[ScheduledSeq], budget: int) -> int:
        rows = self.num_running_rows
        while self.waiting and budget > 0 and rows + self.waiting[0].width <= self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.blocks.match_prefix(seq)
            twin_hits = self.blocks.match_prefix(seq.guide) if seq.guide is not None else []
            if seq.guide is not None:  # the pair starts from the same position
                hits = hits[: len(twin_hits)]
                twin_hits = twin_hits[: len(hits)]
            computed = len(hits) * self.blocks.block_size
            n = self._computable(seq, computed, min(seq.num_tokens - computed, budget // seq.width))
            need = self.blocks.blocks_to_admit(hits, n)
            if seq.guide is not None:
                need += self.blocks.blocks_to_admit(twin_hits, n)
            if n == 0 or need > self.blocks.num_free_blocks:
                break  # FCFS: nobody overtakes the head of the queue
            self.waiting.pop(0)
            for one, one_hits in self._pair(seq, hits, twin_hits):
                self.blocks.admit(one, one_hits)
                one.status = SequenceStatus.RUNNING
            bisect.insort(self.running, seq, key=self._key)
            batch += self._run(seq, computed, n)
            budget -= n * seq.width
            rows += seq.width
        return budget

    @staticmethod
    def _pair(seq: Sequence, hits: list, twin_hits: list) -> list[tuple[Sequence, list]]:
        return [(seq, hits)] if seq.guide is None else [(seq, hits), (seq.guide, twin_hits)]

    @property
    def num_running_rows(self) -> int:
        """Running sequences, twins counted (what `max_num_seqs` bounds)."""
        return sum(seq.width for seq in self.running)

    def _can_append(self, seq: Sequence, n: int) -> bool:
        need = self.blocks.blocks_to_append(seq, n)
        if seq.guide is not None:
            need += self.blocks.blocks_to_append(seq.guide, n)
        return need <= self.blocks.num_free_blocks

    def _run(self, seq: Sequence, start: int, n: int) -> list[ScheduledSeq]:
        """Give `seq` (and its twin) the blocks for `n` positions from `start`; their batch entries."""
        out = []
        for one in (seq,) if seq.guide is None else (seq, seq.guide):
            self.blocks.append(one, n)
            out.append(ScheduledSeq(one, start, n))
        return out

    def _computable(self, seq: Sequence, start: int, n: int) -> int:
        """How many of the `n` positions from `start` have their inputs (all of them without a `ready`)."""
        if self.ready is not None:
            while n > 0 and not self.ready(seq, start + n - 1):
                n -= 1
        return n

    def preempt(self, seq: Sequence) -> None:
        """Free `seq`'s cache (and its twin's) and queue it for recompute (its tokens so far are kept)."""
        self.running.remove(seq)
        for one in (seq,) if seq.guide is None else (seq, seq.guide):
            self.blocks.free_seq(one)
            one.num_computed_tokens = 0
            one.status = SequenceStatus.WAITING
        self.num_preemptions += 1
        self.add(seq)
        logger.debug("preempted sequence %d of %s", seq.seq_id, seq.request.request_id)

    def preempt_all(self) -> None:
        for seq in list(self.running):
            self.preempt(seq)

    def finish(self, seq: Sequence) -> None:
        """Drop `seq` from whichever queue holds it and release its blocks (and its twin's)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        for one in (seq,) if seq.guide is None else (seq, seq.guide):
            self.blocks.free_seq(one)
            one.status = SequenceStatus.FINISHED
