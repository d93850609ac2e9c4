"""Load generation for a running server (or any async request function): requests/s and latency
percentiles at a fixed concurrency.

`run_load` drives any `send(i)` coroutine that returns one `Sample`; `chat_sender` builds one that streams
an OpenAI chat completion over HTTP, so time to first token is measured where a client would see it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx


@dataclasses.dataclass
class Sample:
    latency_s: float
    ttft_s: float
    completion_tokens: int
    ok: bool = True


@dataclasses.dataclass
class LoadResult:
    concurrency: int
    duration_s: float
    samples: list[Sample]

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    def summary(self) -> dict[str, float]:
        ok = self.ok
        latencies = sorted(s.latency_s for s in ok)
        ttfts = sorted(s.ttft_s for s in ok)
        tokens = sum(s.completion_tokens for s in ok)
        return {
            "concurrency": self.concurrency,
            "requests": len(self.samples),
            "errors": len(self.samples) - len(ok),
            "req_per_s": len(ok) / self.duration_s,
            "tok_per_s": tokens / self.duration_s,
            "p50_s": percentile(latencies, 50),
            "p99_s": percentile(latencies, 99),
            "ttft_p50_s": percentile(ttfts, 50),
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: with few samples p99 is the slowest request)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


async def run_load(
    send: Callable[[int], Awaitable[Sample]], num_requests: int, concurrency: int
) -> LoadResult:
    """`num_requests` calls of `send`, at most `concurrency` at a time."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(num_requests):
        queue.put_nowait(i)
    samples: list[Sample] = []

    async def worker() -> None:
        while not queue.empty():
            samples.append(await send(queue.get_nowait()))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return LoadResult(concurrency, time.perf_counter() - start, samples)


def chat_sender(
    client: httpx.AsyncClient, model: str, body: dict[str, Any]
) -> Callable[[int], Awaitable[Sample]]:
    """Streams `/v1/chat/completions` with usage; latency ends at `[DONE]`."""
    payload = {**body, "model": model, "stream": True, "stream_options": {"include_usage": True}}

    async def send(_: int) -> Sample:
        start = time.perf_counter()
        ttft, tokens = float("nan"), 0
        async with client.stream("POST", "/v1/chat/completions", json=payload) as response:
            if response.status_code != 200:
                await response.aread()
                return Sample(time.perf_counter() - start, ttft, 0, ok=False)
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                elif ttft != ttft and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                    ttft = time.perf_counter() - start
        return Sample(time.perf_counter() - start, ttft, tokens)

    return send


def format_table(rows: list[dict[str, float]], title: str) -> str:
    header = ("conc", "reqs", "err", "req/s", "tok/s", "p50 ms", "p99 ms", "ttft p50")
    lines = [title, " ".join(f"{h:>8}" for h in header)]
    for r in rows:
        values = (
            f"{r['concurrency']}",
            f"{r['requests']}",
            f"{r['errors']}",
            f"{r['req_per_s']:.2f}",
            f"{r['tok_per_s']:.1f}",
            f"{r['p50_s'] * 1e3:.1f}",
            f"{r['p99_s'] * 1e3:.1f}",
            f"{r['ttft_p50_s'] * 1e3:.1f}",
        )
        lines.append(" ".join(f"{v:>8}" for v in values))
    return "\n".join(lines)
