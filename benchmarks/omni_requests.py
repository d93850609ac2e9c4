"""Timing requests through `AsyncOmni` as a client sees them: one request's time to first audio, completion
time and waveform (`timed`), and a closed loop of them (`closed_loop`). Shared by the speech and omni
benchmarks."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def timed(omni: Any, prompt: Any, params: Any, began: float | None = None) -> dict:
    """One request: its time to first audio `ttfa`, its completion time `jct` (both from `began`, default
    now), its waveform `wave` and its stage `metrics`."""
    began, first = time.perf_counter() if began is None else began, None
    async for out in omni.generate(prompt, params):
        if first is None and out.delta_audio is not None and out.delta_audio.numel():
            first = time.perf_counter() - began
        if out.finished:
            if out.error is not None:
                raise RuntimeError(out.error)
            wave = out.audio.reshape(-1)
            return {"ttfa": first, "jct": time.perf_counter() - began, "wave": wave, "metrics": out.metrics}
    raise RuntimeError("no terminal output")


async def closed_loop(omni: Any, prompts: list, params: Any, concurrency: int) -> list[dict]:
    """`concurrency` requests in flight, the next sent when one completes; each timed from its sending."""
    slots = asyncio.Semaphore(concurrency)

    async def in_a_slot(prompt: Any) -> dict:
        async with slots:
            return await timed(omni, prompt, params)

    return await asyncio.gather(*(in_a_slot(p) for p in prompts))
