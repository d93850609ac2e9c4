"""Orchestrator overhead: 3 no-op stages, each in its own process, shared-memory connectors.

Prints p50/p99 latency added per stage hop (one hop = orchestrator → stage → orchestrator, taken from the
orchestrator's per-stage completion marks) and requests/s through the 3 stages at concurrency 1 and 64,
with the same pipeline placed inline (no IPC) as the baseline in the same run. `--placement ray` runs the
stages as Ray actors (on a local Ray cluster, or the one `RAY_ADDRESS` names) next to process and inline
placement: what the actors' TCP hops cost against the processes' IPC on the same machine.

    python benchmarks/orchestrator_overhead.py [--requests 3000] [--placement process|ray]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from omnistage import AsyncOmni, PipelineSpec, StageKind, StageSpec
from omnistage.outputs import StageOutput
from omnistage.stages.base import EngineContext, StageRequest


class NoopEngine:
    """Finishes every request on the next step: all remaining latency is the runtime's."""

    def __init__(self, ctx: EngineContext):
        self.pending: list[str] = []

    def add_request(self, request: StageRequest) -> None:
        self.pending.append(request.request_id)

    def add_chunk(self, request_id, inputs, last) -> None:  # noqa: ANN001
        pass

    def abort(self, request_id: str) -> None:
        if request_id in self.pending:
            self.pending.remove(request_id)

    def has_work(self) -> bool:
        return bool(self.pending)

    def step(self) -> list[StageOutput]:
        done, self.pending = self.pending, []
        return [StageOutput(rid, token_ids=[1], finished=True, finish_reason="stop") for rid in done]

    def sleep(self, level: int = 1) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def stats(self) -> dict:
        return {"num_requests": len(self.pending)}


def make_noop(ctx: EngineContext) -> NoopEngine:
    return NoopEngine(ctx)


def pipeline() -> PipelineSpec:
    return PipelineSpec(
        name="noop-3",
        stages=(
            StageSpec(0, "a", StageKind.AR, engine=make_noop),
            StageSpec(1, "b", StageKind.AR, inputs=(0,), engine=make_noop),
            StageSpec(
                2, "c", StageKind.AR, inputs=(1,), engine=make_noop, final_output=True, output_modality="text"
            ),
        ),
    )


async def one(omni: AsyncOmni, i: int) -> dict[str, float]:
    async for out in omni.generate([1, 2, 3], request_id=f"r{i}"):
        if out.finished:
            return out.metrics
    raise RuntimeError("no terminal output")


async def run(omni: AsyncOmni, n: int, concurrency: int) -> tuple[float, list[dict[str, float]]]:
    sem = asyncio.Semaphore(concurrency)
    counter = iter(range(10**9))

    async def bounded() -> dict[str, float]:
        async with sem:
            return await one(omni, next(counter))

    for _ in range(50):  # warm-up
        await one(omni, next(counter))
    t0 = time.perf_counter()
    metrics = await asyncio.gather(*(bounded() for _ in range(n)))
    return n / (time.perf_counter() - t0), metrics


def hops(metrics: list[dict[str, float]]) -> list[float]:
    out = []
    for m in metrics:
        prev = 0.0
        for sid in range(3):
            done = m[f"stage{sid}_done_s"]
            out.append(done - prev)
            prev = done
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--placement", choices=("process", "ray"), default="process")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    results = {}
    placements = ("ray", "process", "inline") if args.placement == "ray" else ("process", "inline")
    for placement in placements:
        # a no-op actor needs no core of its own: three fit on a 2-CPU local cluster
        extra = {"num_cpus": 0.5} if placement == "ray" else {}
        async with AsyncOmni(pipeline(), placement=placement, max_queued_requests=10_000, **extra) as omni:
            rps1, m1 = await run(omni, min(args.requests, 1000), 1)
            rps64, m64 = await run(omni, args.requests, 64)
        h = hops(m1)
        results[placement] = (pct(h, 50) * 1e3, pct(h, 99) * 1e3, rps1, rps64)
        print(
            f"{placement:8s} hop p50 {results[placement][0]:.3f} ms  p99 {results[placement][1]:.3f} ms  "
            f"req/s c=1 {rps1:.0f}  c=64 {rps64:.0f}"
        )
    p, i = results["process"], results["inline"]
    print(f"process/inline: hop p50 {p[0] / i[0]:.2f}x  req/s c=64 {p[3] / i[3]:.2f}x")
    if "ray" in results:
        r = results["ray"]
        print(
            f"ray/process: hop p50 {r[0] / p[0]:.2f}x  p99 {r[1] / p[1]:.2f}x  "
            f"req/s c=1 {r[2] / p[2]:.2f}x  c=64 {r[3] / p[3]:.2f}x"
        )
    print(
        f"targets: hop p50 < 2 ms: {'met' if p[0] < 2 else 'NOT met'} ({p[0]:.3f} ms); "
        f">= 1000 req/s: {'met' if p[3] >= 1000 else 'NOT met'} ({p[3]:.0f} req/s at c=64)"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
