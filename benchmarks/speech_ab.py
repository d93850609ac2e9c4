"""A/B of two running `omnistage serve` speech servers (say one from a checkout of the base commit, one from
the change): rounds of `/v1/audio/speech` at one concurrency, alternating between the two so the machine's
swings hit both alike; per server, the audio-seconds/s of each round and the CPU ticks (1/100 s, from /proc)
each of its processes spent in a round (the API server first, then its stage processes).

    python benchmarks/speech_ab.py --ports 8801,8802 [--rounds 10] [--requests 64] [--concurrency 8]

Start the servers first, e.g. `PYTHONPATH=/path/to/base python -m omnistage serve VOICE_DIR --port 8801`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess

import aiohttp
from speech_serving import speech_load


def processes(port: int) -> list[str]:
    """The server listening on `port` and its children (stage processes)."""
    server = subprocess.check_output(["pgrep", "-f", f"serve .*--port {port}"]).split()[0].decode()
    return [server, *subprocess.check_output(["ps", "-o", "pid=", "--ppid", server]).decode().split()]


def ticks(pids: list[str]) -> list[int]:
    """utime + stime of each process."""
    out = []
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out.append(int(fields[11]) + int(fields[12]))
    return out


def client_session(port: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(f"http://127.0.0.1:{port}", connector=aiohttp.TCPConnector(limit=64))


async def run(args: argparse.Namespace) -> None:
    ports = [int(p) for p in args.ports.split(",")]
    if len(ports) != 2:
        raise SystemExit("--ports takes two ports: A,B")
    pids = {p: processes(p) for p in ports}
    sessions = {p: client_session(p) for p in ports}
    rates: dict[int, list[float]] = {p: [] for p in ports}
    spent: dict[int, list[list[int]]] = {p: [] for p in ports}
    try:
        models = {}
        for p, session in sessions.items():
            async with session.get("/v1/models") as response:
                models[p] = (await response.json())["data"][0]["id"]
            await speech_load(session, models[p], 16, args.concurrency)  # warm-up
        for i in range(args.rounds):
            for p in ports if i % 2 == 0 else ports[::-1]:
                before = ticks(pids[p])
                result = await speech_load(sessions[p], models[p], args.requests, args.concurrency)
                spent[p].append([b - a for a, b in zip(before, ticks(pids[p]), strict=True)])
                rates[p].append(result["audio_s_per_s"])
    finally:
        for session in sessions.values():
            await session.close()
    for p in ports:
        per_process = [statistics.median(r[j] for r in spent[p]) for j in range(len(pids[p]))]
        rounds = " ".join(f"{x:.0f}" for x in rates[p])
        print(f"port {p}: audio-s/s median {statistics.median(rates[p]):.1f} [{rounds}]")
        print(f"  CPU ticks a round (median; API server, then stages): {per_process}")
    ratios = [b / a for a, b in zip(rates[ports[0]], rates[ports[1]], strict=True)]
    each = " ".join(f"{r:.2f}" for r in ratios)
    print(f"B / A per round: [{each}], median {statistics.median(ratios):.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ports", required=True, help="A,B: the two servers' ports")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=64, help="requests a round")
    parser.add_argument("--concurrency", type=int, default=8)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
