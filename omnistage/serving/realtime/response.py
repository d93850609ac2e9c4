"""One response of a realtime session: an ordinary request through the stages, its outputs as events.

The request is the chat request of the whole conversation; text deltas become the transcript (or the text)
and audio deltas pcm16 at 24 kHz, as the stages make them. Cancelling the task (`response.cancel`,
barge-in, a client gone) aborts the request in every stage (`generate`) and still ends the response with
exactly one `response.done`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from omnistage.errors import OmniError
from omnistage.media import resample
from omnistage.serving.artifacts import audio_of, sample_rate_of
from omnistage.serving.context import ServerContext
from omnistage.serving.generation import generate
from omnistage.serving.realtime.audio import encode_pcm16
from omnistage.serving.realtime.conversation import Conversation, Item, new_id
from omnistage.serving.realtime.events import SAMPLE_RATE, ResponseOptions, SessionConfig
from omnistage.serving.served import ServedModel
from omnistage.serving.stage_params import build_stage_params

logger = logging.getLogger(__name__)
Send = Callable[..., Awaitable[None]]


class Response:
    def __init__(self, config: SessionConfig, options: ResponseOptions, hears_audio: bool):
        self.id = new_id("resp")
        self.item = Item(
            new_id("item"), "assistant", "output_audio" if _speaks(config, options) else "output_text"
        )
        self.config, self.options, self.hears_audio = config, options, hears_audio
        self.cancel_reason = "client_cancelled"
        self.first_audio_at: float | None = None
        self.audio_samples = 0
        self.task: asyncio.Task | None = None

    @property
    def speaks(self) -> bool:
        return self.item.kind == "output_audio"

    def playing_until(self) -> float:
        """When the client's playback of the audio sent so far ends, were it played as it arrived."""
        if self.first_audio_at is None:
            return 0.0
        return self.first_audio_at + self.audio_samples / SAMPLE_RATE

    def cancel(self, reason: str) -> bool:
        if self.task is None or self.task.done():
            return False
        self.cancel_reason = reason
        self.task.cancel()
        return True

    def public(self, status: str, details: dict[str, Any] | None = None, usage: Any = None) -> dict[str, Any]:
        output = [self.item.public(status)] if status != "in_progress" else []
        return {
            "id": self.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output,
            "conversation_id": None,
            "output_modalities": ["audio"] if self.speaks else ["text"],
            "max_output_tokens": self._max_tokens() or "inf",
            "audio": {
                "output": {
                    "format": {"type": "audio/pcm", "rate": SAMPLE_RATE},
                    "voice": self.config.audio.output.voice,
                }
            },
            "usage": usage,
            "metadata": self.options.metadata,
        }

    def _max_tokens(self) -> int | None:
        value = self.options.max_output_tokens
        if value is None:
            return self.config.max_tokens
        return None if value == "inf" else int(value)

    # ---- running ----------------------------------------------------------------------------------------
    async def run(
        self, model: ServedModel, ctx: ServerContext, conversation: Conversation, send: Send
    ) -> None:
        """Sends every event of this response; returns once `response.done` is sent."""
        await send("response.created", response=self.public("in_progress"))
        where = {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}
        status, details, usage = "completed", None, None
        text_started = False
        try:
            stream = await self._stream(model, ctx, conversation)
            previous = conversation.add(self.item)
            await send(
                "response.output_item.added",
                response_id=self.id,
                output_index=0,
                item=self.item.public("in_progress"),
            )
            await send(
                "conversation.item.added", previous_item_id=previous, item=self.item.public("in_progress")
            )
            part_type = "audio" if self.speaks else "text"
            empty = {"type": part_type, ("transcript" if self.speaks else "text"): ""}
            await send("response.content_part.added", **where, part=empty)
            text_started = True
            text = ""
            async with contextlib.aclosing(stream):
                async for out in stream:
                    if out.error is not None:
                        raise out.error
                    if out.delta_text:
                        text += out.delta_text
                        self.item.text = text
                        kind = (
                            "response.output_audio_transcript.delta"
                            if self.speaks
                            else "response.output_text.delta"
                        )
                        await send(kind, **where, delta=out.delta_text)
                    samples = audio_of(out, delta=True)
                    if samples is not None and self.speaks:
                        rate = sample_rate_of(out)
                        samples = resample(samples, rate, SAMPLE_RATE) if rate != SAMPLE_RATE else samples
                        if self.first_audio_at is None:
                            self.first_audio_at = time.monotonic()
                        self.audio_samples += len(samples)
                        await send("response.output_audio.delta", **where, delta=encode_pcm16(samples))
                    if out.finished:
                        usage = _usage(out)
            self.item.text = text
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": self.cancel_reason}
            with anyio.CancelScope(shield=True):
                await self._finish(send, where, status, details, usage, text_started)
            raise
        except OmniError as exc:
            status, details = (
                "failed",
                {"type": "failed", "error": {"type": exc.error_type, "message": exc.message}},
            )
            await send(
                "error",
                error={
                    "type": "invalid_request_error" if exc.status_code < 500 else "server_error",
                    "code": "response_failed",
                    "message": exc.message,
                    "param": exc.param,
                },
            )
        except Exception as exc:  # a fault fails this response, never the session
            logger.exception("realtime response %s failed", self.id)
            message = f"internal error ({type(exc).__name__})"
            status, details = (
                "failed",
                {"type": "failed", "error": {"type": "server_error", "message": message}},
            )
            await send("error", error={"type": "server_error", "code": "response_failed", "message": message})
        await self._finish(send, where, status, details, usage, text_started)

    async def _stream(self, model: ServedModel, ctx: ServerContext, conversation: Conversation) -> Any:
        instructions = self.options.instructions or self.config.instructions
        chat = await conversation.prompt(instructions, self.hears_audio)
        voice = self.config.audio.output.voice if self.speaks else None
        prompt = chat.as_prompt(speaker=voice)
        seed = {"seed": self.config.seed} if self.config.seed is not None else {}
        temperature = (
            self.options.temperature if self.options.temperature is not None else self.config.temperature
        )
        sampling = {**seed, **({"temperature": temperature} if temperature is not None else {})}
        max_tokens = self._max_tokens()
        if max_tokens is not None:
            sampling["max_tokens"] = max_tokens
        params = build_stage_params(
            model,
            sampling=sampling,
            generation=seed,
            stage_params=self.config.stage_params,
            route_defaults={"max_tokens": None},  # as chat: the whole answer, up to the context
            limits=model.limits(ctx.settings),
            origins={"max_tokens": "max_output_tokens"},
        )
        modalities = ["text", "audio"] if self.speaks else ["text"]
        return generate(model, ctx.metrics, prompt, params, self.id, modalities)

    async def _finish(
        self, send: Send, where: dict[str, Any], status: str, details: Any, usage: Any, text_started: bool
    ) -> None:
        if text_started:
            text = self.item.text or ""
            if self.speaks:
                await send("response.output_audio.done", **where)
                await send("response.output_audio_transcript.done", **where, transcript=text)
                part = {"type": "audio", "transcript": text}
            else:
                await send("response.output_text.done", **where, text=text)
                part = {"type": "text", "text": text}
            await send("response.content_part.done", **where, part=part)
            item = self.item.public(status if status != "cancelled" else "incomplete")
            await send("response.output_item.done", response_id=self.id, output_index=0, item=item)
            await send("conversation.item.done", item=item)
        await send("response.done", response=self.public(status, details, usage))


def _speaks(config: SessionConfig, options: ResponseOptions) -> bool:
    modalities = options.output_modalities or config.output_modalities
    return modalities == ["audio"]


def _usage(out: Any) -> dict[str, Any]:
    prompt, output = len(out.prompt_token_ids), len(out.token_ids)
    return {
        "total_tokens": prompt + output,
        "input_tokens": prompt,
        "output_tokens": output,
        "input_token_details": {"text_tokens": prompt, "audio_tokens": 0},
        "output_token_details": {"text_tokens": output, "audio_tokens": 0},
    }
