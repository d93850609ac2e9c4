"""One realtime session: its configuration, input audio buffer, VAD, conversation and current response.

The session is a serving object over ordinary requests: a response is one chat request through the stages
(`response.py`), a transcript one transcription request (`transcription.py`). Everything the client sends is
validated first (`events.py`); a bad event gets an `error` event and changes nothing. With server VAD, speech
that starts while a response is being made or played cancels it and clears its audio (barge-in), and the end
of speech commits the buffer and asks for a response. The turn's transcript starts when the speech pauses,
on the very audio the turn will hold if the pause lasts (`vad.py`): the silence wait that tells a pause from
the end of the turn overlaps the transcription; speech that resumes drops it. A session whose client sends
nothing while nothing is being answered is closed after the idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import anyio
from fastapi import WebSocket

from omnistage.errors import OmniError
from omnistage.serving.context import ServerContext
from omnistage.serving.event_rate import RATE_LIMIT_CLOSE, EventRate
from omnistage.serving.realtime import transcription
from omnistage.serving.realtime.audio import AudioBuffer, decode_pcm16, ms
from omnistage.serving.realtime.conversation import Conversation, Item, new_id
from omnistage.serving.realtime.events import (
    BadEvent,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ResponseOptions,
    SessionConfig,
    parse_event,
    validated,
)
from omnistage.serving.realtime.response import Response
from omnistage.serving.realtime.vad import SpeechDetector
from omnistage.serving.served import ServedModel

logger = logging.getLogger(__name__)
HEARS_AUDIO = "realtime"  # the Capabilities route of a model that takes the user's audio itself


# Work on a client's event bigger than this (bytes) runs on a thread: parsing, decoding and the VAD of a
# 10 s append take tens of milliseconds, which would hold every other stream on the server's event loop.
OFF_LOOP_BYTES = 64 * 1024


async def off_loop_if_large(fn: Any, arg: Any, size: int) -> Any:
    return await asyncio.to_thread(fn, arg) if size > OFF_LOOP_BYTES else fn(arg)


class RealtimeSession:
    def __init__(self, websocket: WebSocket, ctx: ServerContext, model: ServedModel):
        self.ws, self.ctx, self.model = websocket, ctx, model
        self.id = new_id("sess")
        self.config = SessionConfig(model=model.name)
        self.buffer = AudioBuffer(ctx.settings.realtime_max_audio_seconds)
        self.vad: SpeechDetector | None = None
        self.speech_item: str | None = None  # the item id of the speech the VAD is hearing
        self.speech_start = 0
        self.early: tuple[int, int, asyncio.Future] | None = None  # a paused turn's transcript: start, end
        self.conversation = Conversation()
        self.response: Response | None = None
        self.background: set[asyncio.Task] = set()
        self.send_lock = asyncio.Lock()
        self.rate = EventRate(ctx.settings.max_ws_events_per_s)
        self._reset_vad()

    @property
    def hears_audio(self) -> bool:
        return self.model.capabilities.serves(HEARS_AUDIO)

    # ---- the socket ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        await self.send("session.created", session=self.config.public(self.id))
        try:
            if await self._listen():
                with contextlib.suppress(Exception):
                    await self.ws.close(1000)
        finally:
            if self.response is not None:
                self.response.cancel("client_disconnected")
            tasks = [t for t in (self.response.task if self.response else None, *self.background) if t]
            for task in tasks:
                task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _listen(self) -> bool:
        """Until the client goes (False) or stays silent past the idle timeout while nothing is being
        answered (True: close the socket)."""
        timeout = self.ctx.settings.realtime_idle_timeout_s
        receiving = asyncio.ensure_future(self.ws.receive())
        try:
            while True:
                done, _ = await asyncio.wait({receiving}, timeout=timeout)
                if not done:
                    if self._answering():
                        continue
                    message = f"no event for {timeout:g} s: closing the idle session"
                    await self._error(BadEvent(message, None, "session_idle_timeout"))
                    return True
                frame = receiving.result()
                if frame["type"] == "websocket.disconnect":
                    return False
                if not self.rate.allow():
                    await self._error(BadEvent(self.rate.message(), None, "rate_limit_exceeded"))
                    await self.ws.close(RATE_LIMIT_CLOSE)
                    return False
                receiving = asyncio.ensure_future(self.ws.receive())
                event: dict[str, Any] = {}
                try:
                    event = await off_loop_if_large(parse_event, frame, len(frame.get("text") or ""))
                    await self._handle(event)
                except BadEvent as exc:
                    await self._error(exc, event.get("event_id"))
        finally:
            receiving.cancel()

    def _answering(self) -> bool:
        busy = self.response is not None and self.response.task is not None and not self.response.task.done()
        return busy or any(not t.done() for t in self.background)

    async def _handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "session.update":
            self._update(event.get("session"))
            await self.send("session.updated", session=self.config.public(self.id))
        elif kind == "input_audio_buffer.append":
            audio = event.get("audio")
            await self._append(await off_loop_if_large(decode_pcm16, audio, len(audio or "")))
        elif kind == "input_audio_buffer.commit":
            if not self.buffer.size:
                raise BadEvent(
                    "the input audio buffer is empty: append audio before committing",
                    None,
                    "input_audio_buffer_commit_empty",
                )
            await self._commit(self.buffer.take())
        elif kind == "input_audio_buffer.clear":
            self.buffer.clear()
            self._reset_vad()
            await self.send("input_audio_buffer.cleared")
        elif kind == "conversation.item.create":
            await self._create_item(event)
        elif kind == "response.create":
            options = validated(ResponseOptions, event.get("response") or {}, "response")
            await self._respond(options)
        elif kind == "response.cancel":
            await self._cancel(event.get("response_id"))

    # ---- configuration ------------------------------------------------------------------------------------
    def _update(self, fields: Any) -> None:
        if not isinstance(fields, dict):
            raise BadEvent("session: session.update needs a `session` object", "session")
        config = self.config.updated(fields)
        if config.model is not None and config.model != self.model.name:
            raise BadEvent(
                f"session.model: this session serves {self.model.name!r}; the model is chosen "
                "when connecting (?model=...)",
                "session.model",
            )
        if config.tools and self.model.capabilities.tool_parser is None:
            raise BadEvent(f"session.tools: model {self.model.name!r} does not call tools", "session.tools")
        try:
            if config.speaks:
                self.ctx.voices.check(self.model, config.audio.output.voice, "session.audio.output.voice")
            wanted = config.audio.input.transcription
            if wanted is not None or not self.hears_audio:
                transcription.transcriber(self.ctx, wanted.model if wanted else None)
        except OmniError as exc:
            raise BadEvent(exc.message, exc.param) from None
        turn_changed = config.audio.input.turn_detection != self.config.audio.input.turn_detection
        self.config = config
        self._drop_early()  # it ran with the settings before
        if turn_changed:
            self._reset_vad()

    def _reset_vad(self) -> None:
        turn = self.config.audio.input.turn_detection
        self._drop_early()
        self.speech_item = None
        self.vad = (
            None
            if turn is None
            else SpeechDetector(
                turn.threshold, turn.prefix_padding_ms, turn.silence_duration_ms, self.buffer.end
            )
        )

    # ---- input audio --------------------------------------------------------------------------------------
    async def _append(self, samples: Any) -> None:
        self.buffer.append(samples)
        if self.vad is None:
            return
        for vad_event in await off_loop_if_large(self.vad.feed, samples, 2 * len(samples)):
            if vad_event.kind == "started":
                self.speech_item, self.speech_start = new_id("item"), vad_event.position
                await self.send(
                    "input_audio_buffer.speech_started",
                    audio_start_ms=ms(vad_event.position),
                    item_id=self.speech_item,
                )
                await self._barge_in()
            elif vad_event.kind == "paused" and self.speech_item is not None:
                self._transcribe_early(vad_event.position)
            elif vad_event.kind == "resumed":
                self._drop_early()
            elif vad_event.kind == "stopped" and self.speech_item is not None:
                item_id, self.speech_item = self.speech_item, None
                await self.send(
                    "input_audio_buffer.speech_stopped", audio_end_ms=ms(vad_event.position), item_id=item_id
                )
                early = self._take_early(self.speech_start, vad_event.position)
                await self._commit(self.buffer.take(self.speech_start, vad_event.position), item_id, early)
                turn = self.config.audio.input.turn_detection
                if turn is not None and turn.create_response and not self._responding():
                    await self._respond(ResponseOptions())

    async def _barge_in(self) -> None:
        """Speech while a response is made or played: it is cancelled and its audio cleared."""
        turn = self.config.audio.input.turn_detection
        response = self.response
        if response is None or turn is None or not turn.interrupt_response:
            return
        cancelled = response.cancel("turn_detected")
        if cancelled:
            with contextlib.suppress(asyncio.CancelledError):
                await response.task
        if cancelled or time.monotonic() < response.playing_until():
            await self.send("output_audio_buffer.cleared", response_id=response.id)
        response.first_audio_at = None  # nothing of it plays any more

    async def _commit(
        self, samples: Any, item_id: str | None = None, early: asyncio.Future | None = None
    ) -> None:
        """The audio as a new user item of the conversation (`input_audio_buffer.committed`); `early`: its
        transcript, already under way."""
        item = Item(item_id or new_id("item"), "user", "input_audio", audio=samples)
        await self._add_item(item, committed=True, early=early)

    def _wants_transcript(self) -> bool:
        return self.config.audio.input.transcription is not None or not self.hears_audio

    def _transcribe_early(self, end: int) -> None:
        """Starts the transcript of the speech so far (up to `end`, the turn's end should the pause last)."""
        self._drop_early()
        if not self._wants_transcript():
            return
        audio = self.buffer.peek(self.speech_start, end)
        task = self._in_background(
            transcription.transcribe(self.ctx, self.config.audio.input.transcription, audio)
        )
        self.early = (self.speech_start, end, task)

    def _take_early(self, start: int, end: int) -> asyncio.Future | None:
        """The early transcript of exactly the audio between `start` and `end`, if one is under way."""
        if self.early is not None and self.early[:2] == (start, end):
            task, self.early = self.early[2], None
            return task
        self._drop_early()
        return None

    def _drop_early(self) -> None:
        if self.early is not None:
            self.early[2].cancel()  # aborts its request in the stages (generation.py); not awaited here
            self.early = None

    def _in_background(self, work: Any) -> asyncio.Future:
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no "never retrieved"
        return task

    async def _add_item(
        self, item: Item, committed: bool = False, early: asyncio.Future | None = None
    ) -> None:
        # an early transcript exists only when one is wanted (a session.update drops it)
        if item.kind == "input_audio" and self._wants_transcript():
            item.heard = self._transcribe(item, self.config.audio.input.transcription, early)
        previous = self.conversation.add(item)
        if committed:
            await self.send("input_audio_buffer.committed", previous_item_id=previous, item_id=item.id)
        await self.send("conversation.item.added", previous_item_id=previous, item=item.public("in_progress"))
        await self.send("conversation.item.done", previous_item_id=previous, item=item.public())

    def _transcribe(self, item: Item, wanted: Any, early: asyncio.Future | None = None) -> asyncio.Future:
        async def run() -> str:
            try:
                text = await (
                    early if early is not None else transcription.transcribe(self.ctx, wanted, item.audio)
                )
            except Exception as exc:
                error = {"type": "server_error", "code": "transcription_failed", "message": str(exc)}
                if isinstance(exc, OmniError):
                    error["message"] = exc.message
                else:
                    logger.exception("realtime transcription of %s failed", item.id)
                await self.send(
                    "conversation.item.input_audio_transcription.failed",
                    item_id=item.id,
                    content_index=0,
                    error=error,
                )
                raise
            item.text = text
            await self.send(
                "conversation.item.input_audio_transcription.completed",
                item_id=item.id,
                content_index=0,
                transcript=text,
            )
            return text

        return self._in_background(run())

    async def _create_item(self, event: dict[str, Any]) -> None:
        kind = (event.get("item") or {}).get("type") if isinstance(event.get("item"), dict) else None
        if kind == "function_call":
            call = validated(FunctionCallItem, event["item"], "item")
            item = Item(call.id or new_id("item"), "assistant", "function_call", name=call.name)
            item.call_id, item.arguments = call.call_id or new_id("call"), call.arguments
            await self._add_item(item)
            return
        if kind == "function_call_output":
            result = validated(FunctionCallOutputItem, event["item"], "item")
            item = Item(result.id or new_id("item"), "tool", "function_call_output", text=result.output)
            item.call_id = result.call_id
            await self._add_item(item)
            return
        message = validated(MessageItem, event.get("item"), "item")
        if len(message.content) != 1:
            raise BadEvent("item.content: omnistage takes one content part per item", "item.content")
        part = message.content[0]
        if part.type == "input_audio":
            if message.role != "user":
                raise BadEvent("item.role: input_audio belongs to a user item", "item.role")
            samples = decode_pcm16(part.audio, "item.content[0].audio")
            limit = self.buffer.max_samples
            if len(samples) > limit:
                raise BadEvent(
                    f"item.content[0].audio: over the limit of {limit // 24000} s",
                    "item.content[0].audio",
                    "input_audio_too_large",
                )
            await self._add_item(Item(message.id or new_id("item"), "user", "input_audio", audio=samples))
            return
        if part.text is None:
            raise BadEvent(f"item.content[0].text: a {part.type} part needs `text`", "item.content[0].text")
        kind = "output_text" if message.role == "assistant" else "input_text"
        await self._add_item(Item(message.id or new_id("item"), message.role, kind, text=part.text))

    # ---- responses ----------------------------------------------------------------------------------------
    def _responding(self) -> bool:
        return self.response is not None and self.response.task is not None and not self.response.task.done()

    async def _respond(self, options: ResponseOptions) -> None:
        if self._responding():
            raise BadEvent(
                f"a response ({self.response.id}) is in progress; cancel it or wait for response.done",
                None,
                "conversation_already_has_active_response",
            )
        if not self.conversation.items:
            raise BadEvent(
                "the conversation is empty: commit audio or create an item first", None, "conversation_empty"
            )
        response = Response(self.config, options, self.hears_audio)
        self.response = response
        response.task = asyncio.ensure_future(
            response.run(self.model, self.ctx, self.conversation, self.send)
        )
        response.task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _cancel(self, response_id: Any) -> None:
        response = self.response
        if response is None or not self._responding() or response_id not in (None, response.id):
            raise BadEvent(
                "no response is in progress" + (f" with id {response_id!r}" if response_id else ""),
                "response_id" if response_id else None,
                "response_cancel_not_active",
            )
        response.cancel("client_cancelled")
        with contextlib.suppress(asyncio.CancelledError):
            await response.task

    # ---- sending ------------------------------------------------------------------------------------------
    async def send(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, "event_id": new_id("event"), **fields}
        async with self.send_lock:
            await self.ws.send_json(event)

    async def _error(self, exc: BadEvent, event_id: Any = None) -> None:
        error = {
            "type": "invalid_request_error",
            "code": exc.code,
            "message": exc.message,
            "param": exc.param,
            "event_id": event_id,
        }
        await self.send("error", error=error)
