"""Cooperative priority for first outputs, for hosts where stages share CPU cores.

When the stages of a pipeline share cores, a streaming request's time to first output (first audio) is set
less by its own work than by who else holds the cores while that first chunk is computed: on 2 cores, the
talker and the other code2wav replica take half of them. Every stage replica has a seat on a small
shared-memory board. A replica whose engine is computing a streaming request's first output writes a
deadline into its seat, renewed every step and cleared when done; a replica of a stage deployed with
`yield_to_first_outputs` waits before each of its own steps while another seat holds a live deadline.

A deadline rather than a flag, so a replica that dies mid-pass cannot stall the others for longer than
`HOLD_S`; and a single wait is bounded by `MAX_WAIT_S`, so a yielding stage always progresses.
"""

from __future__ import annotations

import contextlib
import time
from multiprocessing import shared_memory

import msgspec

from omnistage.connectors.shm import PREFIX, release, untrack

HOLD_S = 0.25  # how long a published first output counts as pending without being renewed
MAX_WAIT_S = 0.5  # the longest one step of a yielding stage waits
POLL_S = 0.001


class BoardSeat(msgspec.Struct, frozen=True):
    """Where a stage replica sits: the board's shared-memory name and its slot."""

    name: str
    slot: int


class FirstOutputBoard:
    """One float64 deadline (`time.monotonic()`, system-wide on Linux) per stage replica."""

    def __init__(self, name: str, slots: int | None = None):
        create = slots is not None
        self.name = name
        self._shm = shared_memory.SharedMemory(name=name, create=create, size=8 * slots if create else 0)
        untrack(self._shm)
        self._deadlines = self._shm.buf.cast("d")  # a new segment is zero-filled: no seat pending

    @classmethod
    def create(cls, owner_pid: int, slots: int) -> FirstOutputBoard:
        """A new board, named like the connector's segments so a killed owner's board is swept too."""
        return cls(f"{PREFIX}{owner_pid}_first_outputs", slots)

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

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._deadlines.release()
            self._shm.close()

    __del__ = close  # the view must go before the mapping, or SharedMemory's own __del__ raises

    def unlink(self) -> None:
        self.close()
        release(self.name)
