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
import urllib.parse
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import websockets

from omnistage.bench.datasets import BenchRequest
from omnistage.bench.metrics import RequestOutput

BACKENDS = ("chat", "completions", "speech", "chat-audio", "images", "videos", "realtime")
PCM_RATE = 24000  # an audio delta without a declared rate is PCM16 mono at 24 kHz (the OpenAI default)
VIDEO_POLL_S = 0.05
REALTIME_CHUNK_S = 0.02  # one microphone packet of a live caller
REALTIME_LEAD_S = 0.2  # silence before the speech: a voice activity detector hears it start
REALTIME_TAIL_MAX_S = 10.0  # silence streamed after the speech while no response has started

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
        except (
            httpx.HTTPError,
            websockets.WebSocketException,
            ValueError,
            KeyError,
            TypeError,
            OSError,
        ) as exc:
            out.error = f"{type(exc).__name__}: {exc}"
            out.latency_s = 0.0
        out.latency_s = out.latency_s or time.perf_counter() - start  # realtime stamps its own turn end
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


def realtime_session(request: BenchRequest, extra: dict[str, Any]) -> dict[str, Any]:
    """The `session.update` of one realtime request: no turn detection (the client ends the turn) and the
    request's output length, with `--extra-body` merged in key by key (it may turn server VAD on)."""
    session: dict[str, Any] = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
    if request.output_len:
        session["max_output_tokens"] = request.output_len
    return merged(session, extra)


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        both_dicts = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both_dicts else value
    return out


async def _realtime(
    client: httpx.AsyncClient,
    model: str,
    request: BenchRequest,
    extra: dict[str, Any],
    out: RequestOutput,
    start: float,
) -> None:
    """One WebSocket `/v1/realtime` session per request: the prompt is the user's turn (its audio when the
    dataset has audio, else the text as an item), then one response is read to `response.done`.

    The clock starts when the user's turn ends, so TTFT and TTFP are turn latencies: at `response.create`
    for text; at the commit for audio without turn detection (sent as fast as the socket takes it); with
    server VAD at the last speech sample, the audio streamed in real time and followed by silence until the
    response starts, so the detector's silence wait counts, as a caller would hear it."""
    session = realtime_session(request, extra)
    vad = (session.get("audio") or {}).get("input", {}).get("turn_detection") is not None
    base = str(client.base_url).rstrip("/").replace("http", "ws", 1)
    url = f"{base}/v1/realtime?{urllib.parse.urlencode({'model': model})}"
    timeout = client.timeout.read
    async with asyncio.timeout(timeout), websockets.connect(url, max_size=None, open_timeout=timeout) as ws:

        async def send(kind: str, **fields: Any) -> None:
            await ws.send(json.dumps({"type": kind, **fields}))

        await send("session.update", session=session)
        await _next_event(ws, "session.updated")
        turn_end: list[float] = []  # stamped once the turn has ended
        started = asyncio.Event()  # the response has begun: no more silence to stream
        speaker = None
        if request.audio is None:
            content = [{"type": "input_text", "text": request.prompt}]
            await send(
                "conversation.item.create", item={"type": "message", "role": "user", "content": content}
            )
        elif not vad:
            for chunk in _pcm_chunks(request.audio):
                await send("input_audio_buffer.append", audio=chunk)
            await send("input_audio_buffer.commit")
        else:
            speaker = asyncio.create_task(_speak_live(send, request.audio, turn_end, started))
        if speaker is None:
            await send("response.create")
            turn_end.append(time.perf_counter())
        try:
            await _read_response(ws, out, turn_end, started)
        finally:
            if speaker is not None:
                speaker.cancel()


async def _next_event(ws: Any, wanted: str) -> dict[str, Any]:
    async for message in ws:
        event = json.loads(message)
        if event.get("type") == "error":
            raise ValueError(f"error event: {(event.get('error') or {}).get('message', event)}")
        if event.get("type") == wanted:
            return event
    raise ValueError(f"the socket closed before {wanted}")


async def _read_response(ws: Any, out: RequestOutput, turn_end: list[float], started: asyncio.Event) -> None:
    """Stamps the response's transcript/text deltas (TTFT, ITL) and audio deltas (TTFP) from the turn's end,
    and its usage and latency at `response.done`; an `error` event or a failed response is the error."""
    chunks = 0
    async for message in ws:
        event = json.loads(message)
        kind = event.get("type", "")
        origin = turn_end[0] if turn_end else time.perf_counter()
        if kind == "error":
            out.error = str((event.get("error") or {}).get("message", event))
            return
        if kind == "response.created":
            started.set()
        elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            if event.get("delta"):
                chunks += 1
                text_delta(out, origin, event["delta"])
        elif kind == "response.output_audio.delta" and event.get("delta"):
            audio_delta(out, origin, len(base64.b64decode(event["delta"])) / 2 / PCM_RATE)
        elif kind == "response.done":
            response = event.get("response") or {}
            if response.get("status") not in ("completed", "incomplete"):  # incomplete: max_output_tokens
                out.error = f"response {response.get('status')}: {response.get('status_details')}"
            _usage(out, response.get("usage"), chunks)
            out.latency_s = time.perf_counter() - origin
            return
    out.error = "the socket closed before response.done"


def _pcm_chunks(pcm: bytes) -> list[str]:
    step = int(REALTIME_CHUNK_S * PCM_RATE) * 2
    return [base64.b64encode(pcm[i : i + step]).decode() for i in range(0, len(pcm), step)]


async def _speak_live(
    send: Callable[..., Awaitable[None]], pcm: bytes, turn_end: list[float], started: asyncio.Event
) -> None:
    """Streams silence, the speech, then silence, in real time (as a microphone would), stamping the turn's
    end when the speech's last chunk is sent; the silence stops once the response has begun."""
    silence = base64.b64encode(bytes(int(REALTIME_CHUNK_S * PCM_RATE) * 2)).decode()
    lead = [silence] * round(REALTIME_LEAD_S / REALTIME_CHUNK_S)
    speech = _pcm_chunks(pcm)
    tail = [silence] * round(REALTIME_TAIL_MAX_S / REALTIME_CHUNK_S)
    began = time.perf_counter()
    for i, chunk in enumerate(lead + speech + tail):
        if i >= len(lead) + len(speech) and started.is_set():
            return
        await send("input_audio_buffer.append", audio=chunk)
        if i == len(lead) + len(speech) - 1:
            turn_end.append(time.perf_counter())
        await asyncio.sleep(max(0.0, began + (i + 1) * REALTIME_CHUNK_S - time.perf_counter()))


SENDERS = {
    "chat": _chat,
    "completions": _completions,
    "speech": _speech,
    "chat-audio": _chat_audio,
    "images": _images,
    "videos": _videos,
    "realtime": _realtime,
}
