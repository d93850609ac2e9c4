"""Loads for the demo set, shared by tests/reliability and benchmarks/soak.py: a mix of every kind of
request the demo serves, and the event loop's stalls as the server's /metrics histogram reports them."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass, field

import httpx
from websockets.asyncio.client import connect

CHAT = "smollm2-135m-instruct"
VOICE = "hibari-en"
SHAPES = "wan-shapes"
WHISPER = "whisper-tiny.en"
KINDS = ("chat", "chat-stream", "spoken-chat-stream", "speech", "speech-stream", "image", "transcription")


@dataclass
class LoadResult:
    done: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def requests(self) -> int:
        return sum(self.done.values()) + len(self.errors)


async def _sse_ok(client: httpx.AsyncClient, path: str, body: dict) -> None:
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                if "error" in event or event.get("type", "").endswith("error"):
                    raise RuntimeError(f"{path}: {event}")


async def _one(client: httpx.AsyncClient, kind: str, i: int, clip: bytes) -> None:
    question = [{"role": "user", "content": f"Say something short about the number {i}."}]
    if kind == "chat":
        r = await client.post(
            "/v1/chat/completions", json={"model": CHAT, "max_tokens": 12, "messages": question}
        )
        r.raise_for_status()
    elif kind == "chat-stream":
        await _sse_ok(
            client,
            "/v1/chat/completions",
            {"model": CHAT, "stream": True, "max_tokens": 16, "messages": question},
        )
    elif kind == "spoken-chat-stream":
        body = {"model": CHAT, "stream": True, "max_tokens": 16, "messages": question}
        body |= {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
        await _sse_ok(client, "/v1/chat/completions", body)
    elif kind == "speech":
        fmt = ("wav", "mp3", "flac", "opus", "pcm")[i % 5]
        body = {"model": VOICE, "input": f"Request number {i} is spoken now.", "response_format": fmt}
        r = await client.post("/v1/audio/speech", json=body)
        r.raise_for_status()
    elif kind == "speech-stream":
        body = {"model": VOICE, "input": f"Streamed request {i}. It has two parts.", "stream": True}
        await _sse_ok(client, "/v1/audio/speech", body)
    elif kind == "image":
        body = {
            "model": SHAPES,
            "prompt": "a red circle",
            "size": "32x32",
            "num_inference_steps": 4,
            "seed": i,
        }
        r = await client.post("/v1/images/generations", json=body)
        r.raise_for_status()
    elif kind == "transcription":
        files = {"file": ("clip.wav", clip, "audio/wav")}
        r = await client.post("/v1/audio/transcriptions", data={"model": WHISPER}, files=files)
        r.raise_for_status()
    else:
        raise ValueError(kind)


async def spoken_clip(url: str) -> bytes:
    """A short WAV said by the demo voice: what the transcription requests send."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        r = await client.post("/v1/audio/speech", json={"model": VOICE, "input": "Hello there, how are you?"})
        r.raise_for_status()
        return r.content


async def mixed_load(url: str, requests: int, concurrency: int, seed: int = 0) -> LoadResult:
    """`requests` requests of every kind in a seeded random order, `concurrency` at a time."""
    clip = await spoken_clip(url)
    rng = random.Random(seed)
    order = [KINDS[i % len(KINDS)] for i in range(requests)]
    rng.shuffle(order)
    result = LoadResult(done={kind: 0 for kind in KINDS})
    queue: asyncio.Queue = asyncio.Queue()
    for item in enumerate(order):
        queue.put_nowait(item)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i, kind = queue.get_nowait()
            try:
                await _one(client, kind, i, clip)
                result.done[kind] += 1
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                result.errors.append(f"{kind} #{i}: {type(exc).__name__}: {exc}"[:300])

    started = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    result.seconds = time.monotonic() - started
    return result


def stall_buckets(url: str) -> dict[float, float]:
    """The event loop stall histogram's cumulative counts by upper bound (seconds)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    pattern = r'omnistage_event_loop_stall_seconds_bucket\{le="([^"]+)"\} (\S+)'
    return {float(le): float(count) for le, count in re.findall(pattern, text)}


def worst_stall_bound(before: dict[float, float], after: dict[float, float]) -> float:
    """The smallest bucket bound that holds every stall between two readings (an upper bound of the
    worst stall in that window)."""
    total = after[float("inf")] - before.get(float("inf"), 0)
    for bound in sorted(after):
        if after[bound] - before.get(bound, 0) >= total:
            return bound
    return float("inf")


async def streamed_burst(url: str, streams: int) -> list[str]:
    """`streams` streamed requests at once, half chat (every other one spoken), half speech; failures."""

    async def one(i: int) -> str | None:
        question = [{"role": "user", "content": f"Tell me a story about the number {i}."}]
        try:
            async with httpx.AsyncClient(base_url=url, timeout=300) as client:
                if i % 2:
                    body = {"model": CHAT, "stream": True, "max_tokens": 64, "messages": question}
                    if i % 4 == 1:
                        body |= {
                            "modalities": ["text", "audio"],
                            "audio": {"voice": "alloy", "format": "pcm16"},
                        }
                    await _sse_ok(client, "/v1/chat/completions", body)
                else:
                    text = f"Stream {i}. " + " ".join(f"Clause {k} of the passage." for k in range(8))
                    await _sse_ok(client, "/v1/audio/speech", {"model": VOICE, "input": text, "stream": True})
        except Exception as exc:  # noqa: BLE001
            return f"stream {i}: {type(exc).__name__}: {exc}"[:300]
        return None

    return [e for e in await asyncio.gather(*(one(i) for i in range(streams))) if e]


async def ping_while(
    url: str, work: asyncio.Future, every_s: float = 0.2, patience_s: float = 20.0
) -> list[float]:
    """A realtime session that pings the server while `work` runs; each pong's round trip (seconds). A ping
    not answered within `patience_s` (the official client's keepalive timeout) raises."""
    rtts = []
    ws_url = url.replace("http://", "ws://") + f"/v1/realtime?model={CHAT}"
    async with connect(ws_url, ping_interval=None) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        while not work.done():
            sent = time.monotonic()
            pong = await ws.ping()
            await asyncio.wait_for(pong, patience_s)
            rtts.append(time.monotonic() - sent)
            await asyncio.wait({work}, timeout=every_s)
    return rtts
