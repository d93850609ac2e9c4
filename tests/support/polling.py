"""Waiting for a condition that another process or thread makes true: a bounded poll, not a fixed sleep.

The deadline only decides when to give up and fail the test; nothing is asserted about how long the wait took.
The pause between two polls is the one `sleep` of the suite's waits: it paces the loop and decides nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.02


def wait_until(condition: Callable[[], T], timeout: float = 60.0, what: str = "the condition") -> T:
    """The first truthy value of `condition()`; AssertionError if there is none within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still not true after {timeout} s (last: {value!r})")
        time.sleep(POLL_S)


async def wait_until_async(
    condition: Callable[[], Awaitable[T]], timeout: float = 60.0, what: str = "the condition"
) -> T:
    """`wait_until` for a coroutine condition, on the running event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = await condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still not true after {timeout} s (last: {value!r})")
        await asyncio.sleep(POLL_S)
