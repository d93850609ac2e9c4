"""The stage board: what each stage replica is doing, for stages that share CPU cores.

When the stages of a pipeline share cores, who holds them decides two things, and every stage replica has a
seat on a small shared-memory board for each:

- **First outputs first.** A streaming request's time to first output (first audio) is set less by its own
  work than by who else holds the cores while that first chunk is computed: on 2 cores, the talker and the
  other code2wav replica take half of them. A replica whose engine is computing a streaming request's first
  output writes a deadline into its seat, renewed every step and cleared when done; a replica of a stage
  deployed with `yield_to_first_outputs` waits before each of its own steps while another seat holds a live
  deadline. A deadline rather than a flag, so a replica that dies mid-pass cannot stall the others for
  longer than `HOLD_S`; and a single wait is bounded by `MAX_WAIT_S`, so a yielding stage always progresses.
- **Solo threads.** A replica marks its seat busy while its engine has work, and notes when it went idle.
  A stage deployed with `solo_threads` computes with that many torch threads while every other seat has
  been idle for `SOLO_QUIET_S` (a full-handoff talker alone on the machine while the thinker and code2wav
  wait), and with its own `num_threads` otherwise, so it takes idle cores without fighting the other stages
  for busy ones: a stage that pauses for a few milliseconds between its inputs (an async-chunk talker paced
  by the thinker) is not idle, as the thread it would wake up to would then find its core taken. A replica
  that dies busy only costs the others their solo threads, never their progress.
"""

from __future__ import annotations

import contextlib
import math
import time
from multiprocessing import resource_tracker, shared_memory

import msgspec

from omnistage.connectors.shm import PREFIX, release

HOLD_S = 0.25  # how long a published first output counts as pending without being renewed
MAX_WAIT_S = 0.5  # the longest one step of a yielding stage waits
POLL_S = 0.001
SOLO_QUIET_S = 0.3  # how long every other seat must have been idle before a stage goes solo


def untrack(shm: shared_memory.SharedMemory) -> None:
    # Python 3.11 registers every segment with the resource tracker of whichever process touches it, which
    # then unlinks it (and warns) at that process's exit; ownership here is explicit instead.
    with contextlib.suppress(Exception):
        resource_tracker.unregister(shm._name, "shared_memory")


class BoardSeat(msgspec.Struct, frozen=True):
    """Where a stage replica sits: the board's shared-memory name and its slot."""

    name: str
    slot: int


class StageBoard:
    """Per stage replica, two float64 times (`time.monotonic()`, system-wide on Linux): a first-output
    deadline, and when it last went idle (infinity while busy, 0 if never busy)."""

    def __init__(self, name: str, slots: int | None = None):
        create = slots is not None
        self.name = name
        self._shm = shared_memory.SharedMemory(name=name, create=create, size=16 * slots if create else 0)
        untrack(self._shm)
        cells = self._shm.buf.cast("d")  # a new segment is zero-filled: nothing pending, nobody busy
        self._cells = cells
        half = len(cells) // 2
        self._deadlines, self._busy = cells[:half], cells[half:]

    @classmethod
    def create(cls, owner_pid: int, slots: int) -> StageBoard:
        """A new board, named like the connector's segments so a killed owner's board is swept too."""
        return cls(f"{PREFIX}{owner_pid}_stage_board", slots)

    # ---- first outputs ---------------------------------------------------------------------------------
    def publish(self, slot: int, pending: bool) -> None:
        self._deadlines[slot] = time.monotonic() + HOLD_S if pending else 0.0

    def others_pending(self, slot: int) -> bool:
        now = time.monotonic()
        return any(deadline > now for i, deadline in enumerate(self._deadlines) if i != slot)

    def wait_for_others(self, slot: int) -> float:
        """Wait (at most `MAX_WAIT_S`) until no other seat has a first output pending; seconds waited."""
        if not self.others_pending(slot):
            return 0.0
        start = time.monotonic()
        while self.others_pending(slot) and time.monotonic() - start < MAX_WAIT_S:
            time.sleep(POLL_S)
        return time.monotonic() - start

    # ---- busy seats --------------------------------------------------------------------------------------
    def set_busy(self, slot: int, busy: bool) -> None:
        self._busy[slot] = math.inf if busy else time.monotonic()

    def others_busy(self, slot: int, quiet_s: float | None = None) -> bool:
        """Whether another seat is busy, or went idle less than `quiet_s` (`SOLO_QUIET_S`) ago."""
        since = time.monotonic() - (SOLO_QUIET_S if quiet_s is None else quiet_s)
        return any(idle > since for i, idle in enumerate(self._busy) if i != slot)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            for view in (self._deadlines, self._busy, self._cells):
                view.release()
            self._shm.close()

    __del__ = close  # the views must go before the mapping, or SharedMemory's own __del__ raises

    def unlink(self) -> None:
        self.close()
        release(self.name)
