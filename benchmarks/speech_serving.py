"""Speech serving on a real `omnistage serve`: `/v1/audio/speech` at concurrency 1, 8 and 32 against the
`hibari` library called directly (one request at a time, with its fastest thread setting), and spoken chat's
time to first audio with async chunk against full handoff.

Speech: every request streams raw PCM (`stream_format: "audio"`), so time to first audio is measured where
a client hears it. Per level: time to first audio p50/p99, real-time factor (request latency / its audio
length, p50) and audio-seconds per second (all audio / wall time). The baseline speaks the same texts with
`Hibari.stream`, its own sentence-by-sentence generator: its first audio is its first sentence. Its
fastest thread setting is measured again in every round (the machine's swings can flip which is faster).
The server's voice runs the deploy's `synthesis: fast` (models/hibari/synthesis.py).

Time to first audio at concurrency 1 is also measured in pairs (one library request, then the same text
through the server, alternating), so the machine's swings hit both alike: the ratio of the two medians is
the time-to-first-audio figure.

Spoken chat: the demo's chat model with its voice, one server per handoff mode (`--stage-overrides` sets
the voice stage's `async_chunk`), the same greedy questions; time to first audio chunk of the SSE stream.

    python benchmarks/speech_serving.py [--requests 32] [--rounds 2] [--pairs 40] [--chat-requests 6]
                                        [--skip-chat]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import aiohttp
import httpx
from local_server import start_server, stop

from omnistage.bench.serve import percentile

CONCURRENCY = (1, 8, 32)
RATE = 24000
TEXTS = [
    "The weather is nice today. We could take a walk in the park after lunch.",
    "Please open the door for me. My hands are full of groceries.",
    "I would like a cup of coffee, with a little milk and no sugar.",
    "Turn left at the next corner; the station is on your right. You cannot miss it.",
    "Good morning, everyone. Today we will talk about the history of the printing press.",
    "The train to the city leaves at seven. Be sure to arrive a few minutes early.",
    "She opened the window and listened to the rain falling on the roof.",
    "Thank you for calling. Your order has shipped and should arrive on Friday.",
    "Reading every day, even for ten minutes, makes a real difference over a year.",
    "The museum is closed on Mondays, but the garden stays open until sunset.",
]
QUESTIONS = [
    "What is the capital of France? Answer in two sentences.",
    "Describe a sunny day at the beach in three sentences.",
    "Give me three tips for learning to cook.",
]


# ---- the library, one request at a time ---------------------------------------------------------------
_VOICES: dict[int, object] = {}


def baseline(requests: int, threads: int) -> dict[str, float]:
    from omnistage.families.hibari.voice import load_hibari

    if threads not in _VOICES:
        _VOICES[threads] = load_hibari(threads)
        _VOICES[threads]("Warm up.")
    tts = _VOICES[threads]
    ttfa, rtf, audio_s = [], [], 0.0
    start = time.perf_counter()
    for i in range(requests):
        began, first, samples = time.perf_counter(), None, 0
        for chunk in tts.stream(TEXTS[i % len(TEXTS)], seed=i):
            first = first if first is not None else time.perf_counter() - began
            samples += len(chunk)
        latency = time.perf_counter() - began
        ttfa.append(first)
        rtf.append(latency / (samples / RATE))
        audio_s += samples / RATE
    wall = time.perf_counter() - start
    return summary(1, ttfa, rtf, audio_s, wall, 0) | {"threads": threads}


def fastest_baseline(requests: int) -> dict[str, float]:
    """The library at its fastest thread setting, measured now: one and two threads, the faster kept."""
    return max((baseline(requests, t) for t in (1, 2)), key=lambda r: r["audio_s_per_s"])


def summary(c: int, ttfa: list[float], rtf: list[float], audio_s: float, wall: float, errors: int) -> dict:
    ttfa = sorted(ttfa)
    return {
        "concurrency": c,
        "requests": len(rtf) + errors,
        "errors": errors,
        "ttfa_p50_s": percentile(ttfa, 50),
        "ttfa_p99_s": percentile(ttfa, 99),
        "rtf_p50": statistics.median(rtf) if rtf else float("nan"),
        "audio_s_per_s": audio_s / wall,
    }


# ---- the server -----------------------------------------------------------------------------------------
async def speech_load(session: aiohttp.ClientSession, model: str, requests: int, concurrency: int) -> dict:
    """The load: aiohttp, whose client costs about a third of httpx's CPU per streamed request on these two
    cores (the client shares them with the server)."""
    queue = list(range(requests))
    ttfa, rtf, audio, errors = [], [], [0.0], [0]

    async def one(i: int) -> None:
        body = {
            "model": model,
            "input": TEXTS[i % len(TEXTS)],
            "response_format": "pcm",
            "stream_format": "audio",
            "seed": i,
        }
        began, first, size = time.perf_counter(), None, 0
        async with session.post("/v1/audio/speech", json=body) as response:
            if response.status != 200:
                errors[0] += 1
                return
            async for data in response.content.iter_any():
                if data and first is None:
                    first = time.perf_counter() - began
                size += len(data)
        latency = time.perf_counter() - began
        seconds = size / 2 / RATE
        ttfa.append(first)
        rtf.append(latency / seconds)
        audio[0] += seconds

    async def worker() -> None:
        while queue:
            await one(queue.pop(0))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return summary(concurrency, ttfa, rtf, audio[0], time.perf_counter() - start, errors[0])


async def chat_ttfa(client: httpx.AsyncClient, model: str, question: str) -> float:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "wav"},
        "temperature": 0,
        "max_tokens": 96,
        "stream": True,
    }
    began = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:]).get("modality") == "audio":
                return time.perf_counter() - began
    raise SystemExit(f"no audio in the spoken answer to {question!r}")


async def server_ttfa(client: httpx.AsyncClient, model: str, i: int) -> float:
    body = {
        "model": model,
        "input": TEXTS[i % len(TEXTS)],
        "response_format": "pcm",
        "stream_format": "audio",
    }
    began = time.perf_counter()
    async with client.stream("POST", "/v1/audio/speech", json={**body, "seed": i}) as response:
        async for data in response.aiter_bytes():
            if data:
                return time.perf_counter() - began
    raise SystemExit("the server sent no audio")


async def paired_ttfa(client: httpx.AsyncClient, model: str, pairs: int) -> tuple[float, float]:
    """(library median, server median) time to first audio, measured alternately on the same texts."""
    from omnistage.families.hibari.voice import load_hibari

    tts = load_hibari(1)
    tts("Warm up.")
    library, served = [], []
    for i in range(pairs):
        began = time.perf_counter()
        next(iter(tts.stream(TEXTS[i % len(TEXTS)], seed=i)))
        library.append(time.perf_counter() - began)
        served.append(await server_ttfa(client, model, i))
    return statistics.median(library), statistics.median(served)


async def run_speech(
    port: int, args: argparse.Namespace
) -> tuple[list[dict], list[list[float]], tuple[float, float]]:
    """Per level, each round runs the library (one request at a time, on one and on two threads, the faster
    kept) and then the server on the same texts: (the server's best round per level, the per-round
    audio-s/s ratios per level, paired TTFA)."""
    base_url = f"http://127.0.0.1:{port}"
    connector = aiohttp.TCPConnector(limit=64)
    timeout = aiohttp.ClientTimeout(total=600)
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=600) as client,
        aiohttp.ClientSession(base_url, connector=connector, timeout=timeout) as session,
    ):
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await speech_load(session, model, 8, 4)  # warm-up
        results, ratios = [], []
        for c in CONCURRENCY:
            rounds, level = [], []
            for _ in range(args.rounds):
                library = fastest_baseline(args.requests)
                served = await speech_load(session, model, max(args.requests, c), c)
                rounds.append(served)
                level.append(served["audio_s_per_s"] / library["audio_s_per_s"])
            results.append(max(rounds, key=lambda r: r["audio_s_per_s"]))
            ratios.append(level)
        return results, ratios, await paired_ttfa(client, model, args.pairs)


async def run_chat(port: int, n: int) -> list[float]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        await chat_ttfa(client, model, QUESTIONS[0])  # warm-up
        return [await chat_ttfa(client, model, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]


def table(rows: list[dict], title: str) -> str:
    lines = [
        title,
        f"{'c':>3} {'req':>4} {'err':>3} {'ttfa p50':>9} {'ttfa p99':>9} {'rtf p50':>8} {'audio-s/s':>10}",
    ]
    for r in rows:
        lines.append(
            f"{r['concurrency']:>3} {r['requests']:>4} {r['errors']:>3} {r['ttfa_p50_s'] * 1e3:>7.1f}ms "
            f"{r['ttfa_p99_s'] * 1e3:>7.1f}ms {r['rtf_p50']:>8.4f} {r['audio_s_per_s']:>10.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=32, help="speech requests per round and level")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per level (the best is kept)")
    parser.add_argument("--chat-requests", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=40, help="alternating library/server TTFA pairs")
    parser.add_argument("--skip-chat", action="store_true")
    parser.add_argument("--port", type=int, default=8771)
    args = parser.parse_args()
    from omnistage.demo import demo_model_dirs
    from omnistage.demo.voice import voice_dir

    print(f"load average: {os.getloadavg()[0]:.2f}")
    base = fastest_baseline(args.requests)
    proc = start_server(str(voice_dir()), args.port, [])
    try:
        served, ratios, (lib_ttfa, served_ttfa) = asyncio.run(run_speech(args.port, args))
    finally:
        stop(proc)
    print(table([base], f"hibari library, one request at a time ({base['threads']} thread(s), its fastest):"))
    print(table(served, "omnistage serve, /v1/audio/speech (stream_format=audio, pcm):"))
    for r, level in zip(served, ratios, strict=True):
        each = " ".join(f"{x:.2f}" for x in level)
        print(
            f"c={r['concurrency']:>2}: audio-s/s {r['audio_s_per_s'] / base['audio_s_per_s']:.2f}x the "
            f"library (best / first baseline run); per round, against the library run just before: [{each}], "
            f"median {statistics.median(level):.2f}x; ttfa p50 {r['ttfa_p50_s'] / base['ttfa_p50_s']:.2f}x"
        )
    print(
        f"time to first audio in {args.pairs} alternating pairs (medians): library {lib_ttfa * 1e3:.1f} ms "
        f"(its first sentence), server {served_ttfa * 1e3:.1f} ms, ratio {served_ttfa / lib_ttfa:.2f}x"
    )
    if not args.skip_chat:
        spoken = str(demo_model_dirs()[0])
        ttfa = {}
        for mode, value in (("async chunk", True), ("full handoff", False)):
            override = json.dumps({"1": {"async_chunk": value}})
            proc = start_server(spoken, args.port, ["--stage-overrides", override])
            try:
                ttfa[mode] = asyncio.run(run_chat(args.port, args.chat_requests))
            finally:
                stop(proc)
        med = {mode: statistics.median(values) for mode, values in ttfa.items()}
        print(
            f"spoken chat, time to first audio (median of {args.chat_requests}): async chunk "
            f"{med['async chunk'] * 1e3:.0f} ms, full handoff {med['full handoff'] * 1e3:.0f} ms, "
            f"ratio {med['async chunk'] / med['full handoff']:.2f}x"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
