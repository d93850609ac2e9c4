"""How a stage shares CPU cores with the other stages of its pipeline: one policy, one deploy block.

On a CPU the stages of one pipeline compete for the same cores, and who holds them decides latency. A stage's
`core_sharing` block (deploy YAML) sets its part:

- `burst_settle_ms`: an idle stage that receives work waits until its inbox has been quiet this long (at
  most 20 ms) so a burst of requests starts as one batch; 0 suits a stage that gains nothing from batching.
- `yield_to_first_outputs`: pause this stage's steps while another stage computes a streaming request's
  first output (time to first audio), at most `stage_board.MAX_WAIT_S` a step.
- `solo_threads`: torch threads while every other stage replica has been idle for a while (cores the
  others leave idle); `num_threads` otherwise. Threads are per process: inline stages ignore it.

The last two go through the pipeline's stage board (stage_board.py: shared memory, one host's). Stages on
accelerators share no cores: the policy is off there (`plain()`), whatever the block says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from omnistage.config.deploy import CoreSharingSettings
from omnistage.runtime.stage_board import BoardSeat, StageBoard

SETTLE_MAX_S = 0.02  # the longest an idle stage waits for the rest of a burst


class CoreSharing:
    """One stage replica's side of the policy, called by its worker loop around each step."""

    def __init__(self, settings: CoreSharingSettings, seat: BoardSeat | None, engine: Any):
        self.settings = settings
        self.engine = engine
        self.seat = seat
        self.board = StageBoard(seat.name) if seat else None
        self.solo_threads = settings.solo_threads if self.board is not None else None
        self.shared_threads = torch.get_num_threads()  # the deployment's num_threads
        self.yielded = {"steps": 0, "seconds": 0.0}
        self.solo_steps = 0

    @classmethod
    def plain(cls, engine: Any) -> CoreSharing:
        """No sharing: no settling, no board (stages on accelerators)."""
        return cls(CoreSharingSettings(burst_settle_ms=0), None, engine)

    def settle(self, wait: Callable[[float], bool], deliver: Callable[[], None]) -> None:
        """Work that wakes an idle engine often comes as a burst (requests sent together, a step's outputs):
        let the rest of it in first, so it starts in one batch rather than one request a step ahead of the
        others, out of step with them in every stage after."""
        quiet_s = self.settings.burst_settle_ms / 1e3
        deadline = time.monotonic() + SETTLE_MAX_S
        while quiet_s and time.monotonic() < deadline and wait(quiet_s):
            deliver()

    def before_step(self) -> None:
        """Yield to other replicas' first outputs (unless computing one here), say whether we are and that
        we are busy, and take the idle cores if nobody else is."""
        if self.board is None:
            return
        slot, pending = self.seat.slot, self._first_output_pending()
        if self.settings.yield_to_first_outputs and not pending:
            waited = self.board.wait_for_others(slot)
            if waited:
                self.yielded["steps"] += 1
                self.yielded["seconds"] += waited
        self.board.publish(slot, pending)
        self.board.set_busy(slot, True)  # before looking at the others: two never both go solo
        if self.solo_threads:
            solo = not self.board.others_busy(slot)
            threads = self.solo_threads if solo else self.shared_threads
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
            self.solo_steps += solo

    def after_step(self) -> None:
        if self.board is not None:
            self.board.publish(self.seat.slot, self._first_output_pending())
            self.board.set_busy(self.seat.slot, self.engine.has_work())

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.board is not None:
            out["first_output_yields"] = dict(self.yielded)
        if self.solo_threads:
            out["solo_steps"] = self.solo_steps
        return out

    def close(self) -> None:
        if self.board is not None:
            self.board.set_busy(self.seat.slot, False)
            self.board.close()

    def _first_output_pending(self) -> bool:
        pending = getattr(self.engine, "first_output_pending", None)
        return bool(pending and pending())
