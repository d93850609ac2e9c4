"""One request of each benchmark backend, timed where a client sees it: streamed routes are read event by
event so the first token and the first audio packet are stamped on arrival. A failure of any kind is the
request's `error`, never an exception: the run goes on and counts it.

Each backend speaks the OpenAI wire format (plus the `modalities` field of omni chat), so it measures any
OpenAI-compatible server, not only omnistage.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx

from omnistage.bench.datasets import BenchRequest
from omnistage.bench.metrics import RequestOutput

BACKENDS = ("chat", "completions", "speech", "chat-audio", "images", "videos")
PCM_RATE = 24000  # an audio delta without a declared rate is PCM16 mono at 24 kHz (the OpenAI default)
VIDEO_POLL_S = 0.05

Sender = Callable[[httpx.AsyncClient, str, BenchRequest, dict[str, Any]], Awaitable[RequestOutput]]


def sender(backend: str) -> Sender:
    """The request function of `backend`, wrapped so any exception becomes a failed `RequestOutput`."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend: unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    send = SENDERS[backend]

    async def guarded(
        client: httpx.AsyncClient, model: str, request: BenchRequest, extra: dict[str, Any]
    ) -> RequestOutput:
        out, start = RequestOutput(), time.perf_counter()
        try:
            await send(client, model, request, extra, out, start)
            out.success = not out.error
        except (httpx.HTTPError, ValueError, KeyError, TypeError, OSError) as exc:
            out.error = f"{type(exc).__name__}: {exc}"
        out.latency_s = time.perf_counter() - start
        return out

    return guarded


async def _sse(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            yield json.loads(line[5:])


async def _events(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], out: RequestOutput
) -> AsyncIterator[dict[str, Any]]:
    """The SSE events of a streamed POST; a non-200 answer raises, an OpenAI error event becomes the
    request's error."""
    async with client.stream("POST", path, json=body) as resp:
        await _check(resp)
        async for event in _sse(resp):
            if "error" in event:
                out.error = str(event["error"].get("message", event["error"]))
            yield event


async def _check(response: httpx.Response) -> None:
    if response.status_code != 200:
        body = (await response.aread()).decode(errors="replace")
        raise ValueError(f"HTTP {response.status_code}: {body[:300]}")


def text_delta(out: RequestOutput, start: float, text: str) -> None:
    """Stamps a text delta's arrival: the first is TTFT, each later one adds an ITL gap."""
    now = time.perf_counter() - start
    if out.ttft_s is None:
        out.ttft_s = now
    else:
        out.itl_s.append(now - out.last_text_s)
    out.last_text_s = now
    out.text += text


def audio_delta(out: RequestOutput, start: float, seconds: float) -> None:
    """Stamps an audio packet of `seconds` of audio: the first is TTFP."""
    now = time.perf_counter() - start
    if out.audio_ttfp_s is None:
        out.audio_ttfp_s = now
    out.audio_chunks.append((now, seconds))


def _usage(out: RequestOutput, usage: dict[str, Any] | None, chunks: int) -> None:
    """Token counts from the stream's usage; without one, each text delta counts as one token."""
    usage = usage or {}
    out.prompt_tokens = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
    out.output_tokens = int(usage.get("completion_tokens") or usage.get("output_tokens") or chunks)


def wav_seconds(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as wav:
        return wav.getnframes() / wav.getframerate()


def _chat_body(model: str, request: BenchRequest, extra: dict[str, Any]) -> dict[str, Any]:
    content: Any = request.prompt
    if request.images:
        content = [{"type": "text", "text": request.prompt}]
        content += [{"type": "image_url", "image_url": {"url": url}} for url in request.images]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": True}
    body["stream_options"] = {"include_usage": True}
    if request.output_len:
        body |= {"max_tokens": request.output_len, "ignore_eos": True}
    return body | extra


async def _chat(
    client: httpx.AsyncClient,
    model: str,
    request: BenchRequest,
    extra: dict[str, Any],
    out: RequestOutput,
    start: float,
) -> None:
    """Streams chat; text deltas time TTFT/ITL, audio deltas (omnistage's `modality: audio` chunks of
    base64 WAV, or OpenAI's `delta.audio.data` PCM16) time TTFP and the stream's continuity."""
    usage, chunks = None, 0
    async for event in _events(client, "/v1/chat/completions", _chat_body(model, request, extra), out):
        usage = event.get("usage") or usage
        for choice in event.get("choices", []):
            delta = choice.get("delta") or {}
            if event.get("modality") == "audio" and delta.get("content"):
                audio_delta(out, start, wav_seconds(base64.b64decode(delta["content"])))
            elif isinstance(delta.get("audio"), dict) and delta["audio"].get("data"):
                audio_delta(out, start, len(base64.b64decode(delta["audio"]["data"])) / 2 / PCM_RATE)
            elif delta.get("content") and event.get("modality", "text") == "text":
                chunks += 1
                text_delta(out, start, delta["content"])
    _usage(out, usage, chunks)


async def _chat_audio(
    client: httpx.AsyncClient,
    model: str,
    request: BenchRequest,
    extra: dict[str, Any],
    out: RequestOutput,
    start: float,
) -> None:
    await _chat(client, model, request, {"modalities": ["text", "audio"], **extra}, out, start)
    if not out.error and not out.audio_chunks:
        out.error = "no audio in the reply"


async def _completions(
    client: httpx.AsyncClient,
    model: str,
    request: BenchRequest,
    extra: dict[str, Any],
    out: RequestOutput,
    start: float,
) -> None:
    body = {
        "model": model,
        "prompt": request.prompt,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if request.output_len:
        body |= {"max_tokens": request.output_len, "ignore_eos": True}
    usage, chunks = None, 0
    async for event in _events(client, "/v1/completions", body | extra, out):
        usage = event.get("usage") or usage
        for choice in event.get("choices", []):
            if choice.get("text"):
                chunks += 1
                text_delta(out, start, choice["text"])
    _usage(out, usage, chunks)


async def _speech(
    client: httpx.AsyncClient,
    model: str,
    request: BenchRequest,
    extra: dict[str, Any],
    out: RequestOutput,
    start: float,
) -> None:
    """`/v1/audio/speech` as SSE of PCM16 deltas; each delta's `sample_rate` sizes it in seconds."""
    body = {"model": model, "input": request.prompt, "stream_format": "sse", "response_format": "pcm"}
    done = False
    async for event in _events(client, "/v1/audio/speech", body | extra, out):
        kind = event.get("type", "")
        if kind.endswith("audio.delta") and event.get("audio"):
            pcm = base64.b64decode(event["audio"])
            audio_delta(out, start, len(pcm) / 2 / int(event.get("sample_rate") or PCM_RATE))
        elif kind.endswith("audio.done"):
            done = True
            usage = event.get("usage") or {}
            out.prompt_tokens = int(usage.get("input_tokens") or 0)
        elif kind.endswith("error"):
            out.error = str((event.get("error") or {}).get("message", event))
    if not out.error and not (done and out.audio_chunks):
        out.error = "the stream ended without audio and a done event"


async def _images(
    client: httpx.AsyncClient,
    model: str,
    request: BenchRequest,
    extra: dict[str, Any],
    out: RequestOutput,
    start: float,
) -> None:
    resp = await client.post(
        "/v1/images/generations", json={"model": model, "prompt": request.prompt} | extra
    )
    await _check(resp)
    data = resp.json().get("data") or []
    out.images = sum(bool(item.get("b64_json") or item.get("url")) for item in data)
    if not out.images:
        out.error = "no image in the reply"


async def _videos(
    client: httpx.AsyncClient,
    model: str,
    request: BenchRequest,
    extra: dict[str, Any],
    out: RequestOutput,
    start: float,
) -> None:
    """Creates a video job, polls it to its end and downloads the file: latency is the client's wait for a
    playable video."""
    resp = await client.post("/v1/videos", json={"model": model, "prompt": request.prompt} | extra)
    await _check(resp)
    job = resp.json()
    while job.get("status") in ("queued", "in_progress"):
        await asyncio.sleep(VIDEO_POLL_S)
        resp = await client.get(f"/v1/videos/{job['id']}")
        await _check(resp)
        job = resp.json()
    if job.get("status") != "completed":
        out.error = f"video job {job.get('status')}: {(job.get('error') or {}).get('message', '')}"
        return
    resp = await client.get(f"/v1/videos/{job['id']}/content")
    await _check(resp)
    out.videos = int(len(resp.content) > 0)
    if not out.videos:
        out.error = "empty video file"


SENDERS = {
    "chat": _chat,
    "completions": _completions,
    "speech": _speech,
    "chat-audio": _chat_audio,
    "images": _images,
    "videos": _videos,
}
