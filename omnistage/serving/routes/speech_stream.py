"""WS /v1/audio/speech/stream: text in as it is written, speech out sentence by sentence.

Client → server (JSON text frames): `session.config` (the speech fields and `stream_audio`; again between
utterances, never while text is buffered), `input.text` (a piece of text), `input.done` (the utterance's text
is complete: speak what is buffered, keep the connection), `session.close` (finish speaking, then close).

Server → client: per sentence `audio.start`, its audio as binary frames (one whole file, or with
`stream_audio` PCM chunks — after a WAV header for `wav` — as the stages make them) and `audio.done`, its one
terminal event (`error: true` after an `error` event when the sentence failed; no `audio.start` then if no
audio began); `session.done` per utterance; `error` for a bad message, which ends nothing.

Each sentence is an ordinary speech request through the stages, spoken in order while the socket keeps
listening: a client that goes away cancels the sentence being spoken, which aborts it in every stage. A socket
whose client sends nothing while nothing is being spoken is closed after the idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import uuid
from typing import Any

import anyio
from fastapi import APIRouter, WebSocket
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect

from omnistage.errors import OmniError
from omnistage.serving.context import ServerContext
from omnistage.serving.errors import field_path
from omnistage.serving.event_rate import RATE_LIMIT_CLOSE, EventRate
from omnistage.serving.generation import generate
from omnistage.serving.media import pcm16, wav_header
from omnistage.serving.protocol import INPUT_MAX, SpeechSessionConfig
from omnistage.serving.sentences import split_sentences
from omnistage.serving.served import ServedModel
from omnistage.serving.speech_requests import (
    audio_chunk,
    check_speech_options,
    speak,
    speech_request,
    validate_speech,
)

logger = logging.getLogger(__name__)
router = APIRouter()
PATH = "/v1/audio/speech/stream"


class BadMessage(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


def _validation_message(exc: ValidationError) -> BadMessage:
    first = exc.errors(include_url=False)[0]
    param = field_path(first.get("loc", ()))
    return BadMessage(f"{param}: {first['msg']}" if param else first["msg"], param)


class SpeechSession:
    """One socket: its config, the text not yet spoken, and the queue of sentences being spoken in order."""

    def __init__(self, websocket: WebSocket, ctx: ServerContext):
        self.ws = websocket
        self.ctx = ctx
        self.config: SpeechSessionConfig | None = None
        self.model: ServedModel | None = None
        self.text = ""  # the current utterance's text after its last complete sentence
        self.utterance = 0
        self.sentences = 0  # sentences of the current utterance queued so far
        self.closing = False
        self.queue: asyncio.Queue = asyncio.Queue()
        self.pending = 0  # queue items not yet finished
        self.send_lock = asyncio.Lock()
        self.rate = EventRate(ctx.settings.max_ws_events_per_s)

    async def run(self) -> None:
        listener = asyncio.ensure_future(self._listen())
        speaker = asyncio.ensure_future(self._speak_in_order())
        try:
            await asyncio.wait({listener, speaker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (listener, speaker):
                task.cancel()  # a sentence still being spoken is aborted in every stage
            with anyio.CancelScope(shield=True):
                ended = await asyncio.gather(listener, speaker, return_exceptions=True)
            for result in ended:
                if isinstance(result, Exception):  # mostly a client gone while being answered
                    logger.info("speech stream ended: %s: %s", type(result).__name__, result)
        if _succeeded(speaker) or (_succeeded(listener) and listener.result()):  # closed, or idle
            with contextlib.suppress(Exception):
                await self.ws.close(1000)

    # ---- the client's messages ------------------------------------------------------------------------
    async def _listen(self) -> bool:
        """Until the client goes (False) or stays silent past the idle timeout while nothing is being
        spoken (True: close the socket)."""
        timeout = self.ctx.settings.speech_stream_idle_timeout_s
        receiving = asyncio.ensure_future(self.ws.receive())
        try:
            while True:
                done, _ = await asyncio.wait({receiving}, timeout=timeout)
                if not done:
                    if self.pending:
                        continue
                    await self._send_json({"type": "error", "message": f"idle for {timeout} s: closing"})
                    return True
                message = receiving.result()
                if message["type"] == "websocket.disconnect":
                    return False
                if not self.rate.allow():
                    await self._send_json({"type": "error", "message": self.rate.message()})
                    await self.ws.close(RATE_LIMIT_CLOSE)
                    return False
                receiving = asyncio.ensure_future(self.ws.receive())
                try:
                    await self._handle(message)
                except BadMessage as exc:
                    await self._error(exc.message, exc.param)
        finally:
            receiving.cancel()

    async def _handle(self, message: dict[str, Any]) -> None:
        if message.get("text") is None:
            raise BadMessage("messages must be JSON text frames, not binary")
        try:
            data = json.loads(message["text"])
        except json.JSONDecodeError as exc:
            raise BadMessage(f"message is not valid JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise BadMessage("message must be a JSON object with a `type`", "type")
        kind = data.get("type")
        if self.closing:
            raise BadMessage(f"type: {kind!r} after session.close", "type")
        if kind == "session.config":
            self._configure(data)
        elif kind not in ("input.text", "input.done", "session.close"):
            known = "session.config, input.text, input.done, session.close"
            raise BadMessage(f"type: unknown message type {kind!r} ({known})", "type")
        elif self.config is None:
            raise BadMessage(f"type: {kind} before session.config; configure the session first", "type")
        elif kind == "input.text":
            self._add_text(data.get("text"))
        elif kind == "input.done":
            self._finish_utterance(required=True)
        else:
            self._finish_utterance(required=False)
            self.closing = True
            self._enqueue(None)

    def _configure(self, data: dict[str, Any]) -> None:
        if self.text.strip():
            raise BadMessage("type: session.config while text is buffered; send input.done first", "type")
        try:
            config = SpeechSessionConfig.model_validate(data)
            model = self.ctx.models.get(config.model, produces=["audio"], route=PATH, serves="speech")
            probe = config.speech("")
            check_speech_options(probe, model)
            self.ctx.voices.check(model, probe.voice_name)
        except ValidationError as exc:
            raise _validation_message(exc) from None
        except OmniError as exc:
            raise BadMessage(exc.message, exc.param) from None
        self.config, self.model = config, model

    def _add_text(self, text: Any) -> None:
        if not isinstance(text, str):
            raise BadMessage("text: input.text needs a string `text`", "text")
        sentences, rest = split_sentences(self.text + text, final=False)
        if len(rest) > INPUT_MAX:
            raise BadMessage(f"text: over {INPUT_MAX} characters without a sentence end", "text")
        self.text = rest
        for sentence in sentences:
            self._enqueue_sentence(sentence)

    def _finish_utterance(self, required: bool) -> None:
        sentences, self.text = split_sentences(self.text, final=True)
        for sentence in sentences:
            self._enqueue_sentence(sentence)
        if not self.sentences:
            if required:
                raise BadMessage("text: the utterance has no text to speak", "text")
            return
        self._enqueue(("done", self.utterance, self.sentences))
        self.utterance, self.sentences = self.utterance + 1, 0

    def _enqueue_sentence(self, text: str) -> None:
        self._enqueue(("sentence", self.utterance, self.sentences, text, self.config, self.model))
        self.sentences += 1

    def _enqueue(self, item: Any) -> None:
        self.pending += 1
        self.queue.put_nowait(item)

    # ---- speaking ---------------------------------------------------------------------------------------
    async def _speak_in_order(self) -> None:
        """Returns after session.close's queued work is done."""
        while True:
            item = await self.queue.get()
            try:
                if item is None:
                    return
                if item[0] == "done":
                    _, utterance, count = item
                    event = {"type": "session.done", "utterance_index": utterance, "total_sentences": count}
                    await self._send_json(event)
                else:
                    await self._sentence(*item[1:])
            finally:
                self.pending -= 1

    async def _sentence(
        self, utterance: int, index: int, text: str, config: SpeechSessionConfig, model: ServedModel
    ) -> None:
        where = {"utterance_index": utterance, "sentence_index": index}
        state = {"total": 0, "started": False}

        async def start(rate: int) -> None:
            state["started"] = True
            event = {"type": "audio.start", **where, "sentence_text": text}
            await self._send_json({**event, "format": config.response_format, "sample_rate": rate})

        async def send(data: bytes) -> None:
            state["total"] += len(data)
            async with self.send_lock:
                await self.ws.send_bytes(data)

        failed = False
        try:
            body = config.speech(text)
            request_id = f"speech-ws-{uuid.uuid4().hex}"
            if body.stream:
                await self._stream(body, model, request_id, start, send)
            else:
                _, data, rate = await speak(body, model, self.ctx, request_id)
                await start(rate)
                await send(data)
        except ValidationError as exc:
            failed = True
            bad = _validation_message(exc)
            await self._error(bad.message, bad.param, **where)
        except OmniError as exc:
            failed = True
            await self._error(exc.message, exc.param, exc.status_code, **where)
        except Exception as exc:  # a fault here fails this sentence, never the session
            logger.exception("speech stream: sentence %d of utterance %d failed", index, utterance)
            failed = True
            await self._error(f"internal error ({type(exc).__name__})", None, 500, **where)
        event = {"type": "audio.done", **where, "total_bytes": state["total"], "error": failed}
        await self._send_json(event)

    async def _stream(self, body: Any, model: ServedModel, request_id: str, start: Any, send: Any) -> None:
        """The sentence's audio as the stages make it."""
        validate_speech(body, model)
        prompt, params = await speech_request(body, model, self.ctx)
        stream = generate(model, self.ctx.metrics, prompt, params, request_id, ["audio"])
        started = False
        async with contextlib.aclosing(stream):
            async for out in stream:
                if out.error is not None:
                    raise out.error
                samples, rate = audio_chunk(out, body)
                if not started:
                    started = True
                    await start(rate)
                    if body.response_format == "wav":
                        await send(wav_header(rate))
                if samples is not None:
                    await send(pcm16(samples))

    # ---- sending ---------------------------------------------------------------------------------------
    async def _send_json(self, event: dict[str, Any]) -> None:
        async with self.send_lock:
            await self.ws.send_json(event)

    async def _error(self, message: str, param: str | None, code: int = 400, **where: int) -> None:
        await self._send_json({"type": "error", "message": message, "param": param, "code": code, **where})


def _succeeded(task: asyncio.Future) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


KEY_SUBPROTOCOL = "openai-insecure-api-key."  # a browser cannot set headers on a WebSocket: the OpenAI way


def _authorized(websocket: WebSocket, key: str | None) -> bool:
    """The key as a bearer token, or (from a browser) as the subprotocol `openai-insecure-api-key.<key>`."""
    if key is None:
        return True
    scheme, _, token = websocket.headers.get("authorization", "").partition(" ")
    tokens = [token.strip()] if scheme.lower() == "bearer" else []
    protocols = websocket.scope.get("subprotocols", [])
    tokens += [p.removeprefix(KEY_SUBPROTOCOL) for p in protocols if p.startswith(KEY_SUBPROTOCOL)]
    return any(hmac.compare_digest(t.encode(), key.encode()) for t in tokens)


@router.websocket(PATH)
async def speech_stream(websocket: WebSocket) -> None:
    ctx: ServerContext = websocket.app.state.omnistage
    if ctx.state.draining or not _authorized(websocket, ctx.settings.api_key):
        await websocket.close(1008)  # policy violation: no key, or the server is shutting down
        return
    await websocket.accept()
    try:
        await SpeechSession(websocket, ctx).run()
    except WebSocketDisconnect:
        logger.info("speech stream: client disconnected")
