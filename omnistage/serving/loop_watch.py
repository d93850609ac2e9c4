"""How late the server's event loop runs: its worst stalls, measured all the time the server is up.

Everything a client sees passes through one event loop: SSE tokens, audio chunks, WebSocket pings. A
callback that holds it for a second holds every stream for a second, and a WebSocket whose ping waits past
the client's keepalive timeout is dropped (the official realtime client's is 20 s). A timer that should fire
every `INTERVAL_S` measures how late it fires: that lateness is the longest anything held the loop. The
figures go to `/metrics` (`omnistage_event_loop_stall_seconds`, a histogram, and the worst since start).

With `OMNISTAGE_LOOP_STALL_LOG_MS` set, a watchdog thread logs the loop thread's stack whenever the loop has
not ticked for that long: what is holding it, caught in the act.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import traceback

from prometheus_client import CollectorRegistry, Gauge, Histogram

logger = logging.getLogger(__name__)

INTERVAL_S = 0.01
BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STALL_LOG_VARIABLE = "OMNISTAGE_LOOP_STALL_LOG_MS"


class LoopWatch:
    def __init__(self, registry: CollectorRegistry):
        self.stalls = Histogram(
            "omnistage_event_loop_stall_seconds",
            "how late the server's event loop ran a timer (the longest anything held it), per tick",
            buckets=BUCKETS,
            registry=registry,
        )
        self.worst = Gauge(
            "omnistage_event_loop_worst_stall_seconds",
            "the longest the server's event loop was held since the server started",
            registry=registry,
        )
        self.worst_s = 0.0
        self.last_tick = time.monotonic()
        self._task: asyncio.Task | None = None
        self._loop_thread = threading.get_ident()
        self._stopped = threading.Event()

    def start(self) -> None:
        """On the loop to watch (the app's lifespan)."""
        self._loop_thread = threading.get_ident()
        self.last_tick = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._tick())
        log_ms = os.environ.get(STALL_LOG_VARIABLE)
        if log_ms:
            threading.Thread(target=self._watchdog, args=(float(log_ms) / 1e3,), daemon=True).start()

    async def stop(self) -> None:
        self._stopped.set()
        if self._task is not None:
            self._task.cancel()

    async def _tick(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(INTERVAL_S)
            self.last_tick = now = time.monotonic()
            late = max(0.0, now - before - INTERVAL_S)
            self.stalls.observe(late)
            if late > self.worst_s:
                self.worst_s = late
                self.worst.set(late)

    def _watchdog(self, threshold_s: float) -> None:
        reported = None
        while not self._stopped.wait(threshold_s / 4):
            tick = self.last_tick
            if time.monotonic() - tick > threshold_s and reported != tick:
                reported = tick
                frame = sys._current_frames().get(self._loop_thread)
                stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)"
                logger.warning(
                    "the event loop has been held for over %.0f ms, in:\n%s", threshold_s * 1e3, stack
                )
