"""A turn ended early (eager end of turn): the work on a segment the VAD may still withdraw.

When speech goes quiet the session commits the segment, transcribes it and asks for the response at once,
but every event of that work waits here until the VAD confirms the stop; speech that resumes first cancels
the work (aborting its requests in every stage) and its events are dropped, so the client never sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from omnistage.serving.realtime.conversation import Item
from omnistage.serving.realtime.response import Response

Send = Callable[..., Awaitable[None]]


class HeldSend:
    """A `send` whose events are kept until `release` (then sent in order, and later ones go straight
    through) or dropped for good by `drop`."""

    def __init__(self, send: Send):
        self.target = send
        self.events: list[tuple[str, dict[str, Any]]] | None = []
        self.dropped = False

    async def __call__(self, kind: str, **fields: Any) -> None:
        if self.dropped:
            return
        if self.events is not None:
            self.events.append((kind, fields))
            return
        await self.target(kind, **fields)

    async def release(self) -> None:
        while self.events:  # events held while flushing are flushed too, in order
            kind, fields = self.events.pop(0)
            await self.target(kind, **fields)
        self.events = None

    def drop(self) -> None:
        self.dropped, self.events = True, None


class PendingTurn:
    """The segment [start, end) committed as `item`, its response (if one was asked for) and the response
    that was current before it."""

    def __init__(self, send: Send, start: int, end: int):
        self.send = HeldSend(send)
        self.start, self.end = start, end
        self.item: Item | None = None
        self.response: Response | None = None
        self.previous: Response | None = None

    async def cancel(self) -> None:
        """Drops the events and cancels the work, until every request it made has been aborted."""
        self.send.drop()
        tasks = []
        if self.response is not None and self.response.cancel("turn_detected"):
            tasks.append(self.response.task)
        heard = self.item.heard if self.item is not None else None
        if heard is not None and not heard.done():
            heard.cancel()
            tasks.append(heard)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
