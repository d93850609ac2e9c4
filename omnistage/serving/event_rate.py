"""A bound on how fast one WebSocket client may send events, so a flood cannot monopolise the event loop.

A token bucket: `rate` events a second on average, bursts of up to `burst`. Audio streamed in 20 ms pieces is
50 events a second; the default bound (`--max-ws-events-per-second`) leaves room for ten times that. A client
over it gets an `error` event and its socket is closed (1008, policy violation): it cannot be served, and
reading its events only to refuse them would still cost the loop.
"""

from __future__ import annotations

import time

RATE_LIMIT_CLOSE = 1008


class EventRate:
    def __init__(self, rate: float, burst: float | None = None):
        self.rate = rate
        self.burst = burst if burst is not None else 2 * rate
        self.tokens = self.burst
        self.last = time.monotonic()

    def allow(self) -> bool:
        """Take one event's token; False when the client is over its rate."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True

    def message(self) -> str:
        return f"more than {self.rate:g} events a second (bursts of {self.burst:g}): closing the connection"
