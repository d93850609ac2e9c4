"""Soak: the demo server under long mixed load, and its event loop under 32 concurrent streams.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/soak.py [--rounds 4] [--requests 500] [--concurrency 32]

Starts `omnistage serve` on the demo set (as tests/reliability does: every stage in its own process, AR KV
pools of --kv-cache-bytes), then:
1. the event loop's worst stall (the server's /metrics histogram) and a realtime client's ping round trips
   under 32 concurrent streamed chat and speech requests, against the same figures with the server idle;
2. `--rounds` rounds of `--requests` mixed requests (chat, streamed and spoken chat, speech in every
   format, streamed speech, images, transcriptions) at `--concurrency`: errors, and the RSS of the server and
   its stage processes after each round (the first round is the warm-up);
3. after the server stops: processes left with its marker in their environment, and its /dev/shm segments.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.reliability.conftest import KV_CACHE_BYTES, held, rss_bytes, server_pids  # noqa: E402
from tests.reliability.leftovers import MARK_VARIABLE, new_mark, processes_marked, segments_of  # noqa: E402
from tests.reliability.mixed_load import (  # noqa: E402
    mixed_load,
    ping_while,
    stall_buckets,
    streamed_burst,
    worst_stall_bound,
)
from tests.support.polling import wait_until  # noqa: E402
from tests.support.server_process import ServerProcess  # noqa: E402


def loop_figures(url: str, streams: int) -> tuple[float, list[float], list[str]]:
    async def run() -> tuple[list[str], list[float]]:
        burst = asyncio.ensure_future(streamed_burst(url, streams) if streams else asyncio.sleep(10))
        rtts = await ping_while(url, burst)
        return (await burst) or [], rtts

    before = stall_buckets(url)
    failures, rtts = asyncio.run(run())
    return worst_stall_bound(before, stall_buckets(url)), rtts, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--kv-cache-bytes", type=int, default=KV_CACHE_BYTES)
    args = parser.parse_args()

    from omnistage.demo import demo_model_dirs

    root = Path(tempfile.mkdtemp(prefix="omnistage-soak-"))
    command = ["serve", *map(str, demo_model_dirs()), "--num-threads", "1", "--storage-dir", str(root / "s")]
    command += ["--voices-dir", str(root / "v"), "--kv-cache-bytes", str(args.kv_cache_bytes)]
    mark = new_mark()
    server = ServerProcess(command, root / "server.log", module="omnistage", env={MARK_VARIABLE: mark})
    try:
        server.wait_healthy(timeout=300)
        url = server.url
        assert not asyncio.run(streamed_burst(url, 4)), "warm-up failed"
        idle, idle_rtts, _ = loop_figures(url, 0)
        busy, busy_rtts, failures = loop_figures(url, args.streams)
        slowest = max(idle_rtts) * 1e3
        print(f"event loop, idle 10 s: worst stall <= {idle * 1e3:.0f} ms, slowest pong {slowest:.1f} ms")
        print(
            f"event loop, {args.streams} streams: worst stall <= {busy * 1e3:.0f} ms (goal < 100 ms: "
            f"{busy / 0.1:.2f}x of it), {len(busy_rtts)} pings answered, slowest pong "
            f"{max(busy_rtts) * 1e3:.1f} ms, {len(failures)} failed streams"
        )
        wait_until(lambda: not held(url), 60, "stages free")
        pids = server_pids(server)
        rss = [rss_bytes(pids)]
        total, errors = 0, 0
        for r in range(args.rounds):
            result = asyncio.run(mixed_load(url, args.requests, args.concurrency, seed=r))
            wait_until(lambda: not held(url), 60, "stages free")
            rss.append(rss_bytes(pids))
            total, errors = total + result.requests, errors + len(result.errors)
            print(
                f"round {r} ({'warm-up' if r == 0 else 'measured'}): {result.requests} requests in "
                f"{result.seconds:.1f} s, {len(result.errors)} errors, RSS {rss[-1] / 2**20:.0f} MiB "
                f"({(rss[-1] - rss[-2]) / 2**20:+.0f})"
            )
            for line in result.errors[:3]:
                print("   ", line)
        same = sorted(server_pids(server)) == sorted(pids)
        segments = segments_of(server.proc.pid)
        stages = len(pids) - 1
        print(f"while idle after the rounds: the same {stages} stage processes: {same}; shm: {segments}")
    finally:
        code = server.stop()
    started = time.monotonic()
    wait_until(lambda: processes_marked(mark) == [], 30, "every process gone")
    gone_s = time.monotonic() - started
    left = segments_of(server.proc.pid)
    print(f"server exit {code}; processes left: {processes_marked(mark)} ({gone_s:.1f} s); shm left: {left}")
    after_warm = rss[1]
    growth = (rss[-1] - after_warm) / after_warm if len(rss) > 2 else 0.0
    print(
        f"SOAK: {total} requests, {errors} errors; RSS {rss[0] / 2**20:.0f} MiB at start, "
        f"{after_warm / 2**20:.0f} after the warm-up round, {rss[-1] / 2**20:.0f} after the last "
        f"({growth:+.1%} over {args.rounds - 1} measured rounds)"
    )
    return 0 if errors == 0 and same and not segments else 1


if __name__ == "__main__":
    sys.exit(main())
