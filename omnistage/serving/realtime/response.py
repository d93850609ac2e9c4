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
from omnistage.serving.tool_calls import ToolPlan, plan_tools, tool_parser_of
from omnistage.serving.tool_parsers import Delta, Reader

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
        self.outputs: list[Item] = []  # the message (once it has content) and the calls, in order
        self.calls: list[Item] = []
        self.where: dict[str, Any] = {}  # the message's place, in its events

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
        output = [item.public(status) for item in self.outputs] if status != "in_progress" else []
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
        status, details, usage = "completed", None, None
        try:
            stream, reader = await self._stream(model, ctx, conversation)
            if reader is None:  # no calls to read: the answer's item opens at once
                await self._open_message(conversation, send)
            async with contextlib.aclosing(stream):
                async for out in stream:
                    if out.error is not None:
                        raise out.error
                    deltas = _deltas(reader, out)
                    for delta in deltas:
                        await self._on_delta(delta, conversation, send)
                    samples = audio_of(out, delta=True)
                    if samples is not None and self.speaks and len(samples):
                        await self._open_message(conversation, send)
                        rate = sample_rate_of(out)
                        samples = resample(samples, rate, SAMPLE_RATE) if rate != SAMPLE_RATE else samples
                        if self.first_audio_at is None:
                            self.first_audio_at = time.monotonic()
                        self.audio_samples += len(samples)
                        await send("response.output_audio.delta", **self.where, delta=encode_pcm16(samples))
                    if out.finished:
                        usage = _usage(out)
            if not self.calls:  # an answer, if an empty one
                await self._open_message(conversation, send)
        except asyncio.CancelledError:
            status, details = "cancelled", {"type": "cancelled", "reason": self.cancel_reason}
            with anyio.CancelScope(shield=True):
                await self._finish(send, status, details, usage)
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
        await self._finish(send, status, details, usage)

    async def _open_message(self, conversation: Conversation, send: Send) -> None:
        """The answer's item, once: added to the conversation and announced with its empty part."""
        if self.where:
            return
        self.item.text = ""
        self.outputs.append(self.item)
        previous = conversation.add(self.item)
        index = len(self.outputs) - 1
        self.where = {
            "response_id": self.id,
            "item_id": self.item.id,
            "output_index": index,
            "content_index": 0,
        }
        item = self.item.public("in_progress")
        await send("response.output_item.added", response_id=self.id, output_index=index, item=item)
        await send("conversation.item.added", previous_item_id=previous, item=item)
        part_type = "audio" if self.speaks else "text"
        empty = {"type": part_type, ("transcript" if self.speaks else "text"): ""}
        await send("response.content_part.added", **self.where, part=empty)

    async def _on_delta(self, delta: Delta, conversation: Conversation, send: Send) -> None:
        if delta.kind == "content":
            await self._open_message(conversation, send)
            self.item.text = (self.item.text or "") + delta.text
            kind = "response.output_audio_transcript.delta" if self.speaks else "response.output_text.delta"
            await send(kind, **self.where, delta=delta.text)
        elif delta.kind == "call":
            call = Item(new_id("item"), "assistant", "function_call", name=delta.name, call_id=delta.call_id)
            self.calls.append(call)
            self.outputs.append(call)
            previous = conversation.add(call)
            item = call.public("in_progress")
            index = len(self.outputs) - 1
            await send("response.output_item.added", response_id=self.id, output_index=index, item=item)
            await send("conversation.item.added", previous_item_id=previous, item=item)
        else:
            call = self.calls[delta.index]
            call.arguments += delta.text
            await send(
                "response.function_call_arguments.delta",
                response_id=self.id,
                item_id=call.id,
                output_index=self.outputs.index(call),
                call_id=call.call_id,
                delta=delta.text,
            )

    async def _stream(
        self, model: ServedModel, ctx: ServerContext, conversation: Conversation
    ) -> tuple[Any, Reader | None]:
        """The request's output stream, and the reader of its tool calls (None: no calls are read)."""
        instructions = self.options.instructions or self.config.instructions
        tools = self._tool_plan(model, ctx)
        chat = await conversation.prompt(instructions, self.hears_audio)
        voice = self.config.audio.output.voice if self.speaks else None
        prompt = chat.as_prompt(speaker=voice, tools=tools.tools)
        seed = {"seed": self.config.seed} if self.config.seed is not None else {}
        temperature = (
            self.options.temperature if self.options.temperature is not None else self.config.temperature
        )
        sampling = {**seed, **({"temperature": temperature} if temperature is not None else {})}
        max_tokens = self._max_tokens()
        if max_tokens is not None:
            sampling["max_tokens"] = max_tokens
        if tools.constraint is not None:  # a required or named call: its JSON, by grammar, never spoken
            sampling["structured_outputs"] = tools.constraint
        params = build_stage_params(
            model,
            sampling=sampling,
            generation=seed,
            stage_params=self.config.stage_params,
            route_defaults={"max_tokens": None},  # as chat: the whole answer, up to the context
            limits=model.limits(ctx.settings),
            origins={"max_tokens": "max_output_tokens"},
        )
        speaks = self.speaks and tools.constraint is None
        modalities = ["text", "audio"] if speaks else ["text"]
        return generate(model, ctx.metrics, prompt, params, self.id, modalities), tools.reader()

    def _tool_plan(self, model: ServedModel, ctx: ServerContext) -> ToolPlan:
        tools = self.options.tools if self.options.tools is not None else self.config.tools
        choice = self.options.tool_choice or self.config.tool_choice
        if not isinstance(choice, str):
            choice = {"type": "function", "function": {"name": choice.name}}
        parser = tool_parser_of(model.capabilities, ctx.settings)
        listed = [tool.as_chat_tool() for tool in tools] or None
        return plan_tools(listed, choice, True, parser, model.name)

    async def _finish(self, send: Send, status: str, details: Any, usage: Any) -> None:
        done = status if status != "cancelled" else "incomplete"
        for index, item in enumerate(self.outputs):
            if item is self.item:
                await self._finish_message(send, done)
                continue
            call = {"call_id": item.call_id, "name": item.name, "arguments": item.arguments}
            await send(
                "response.function_call_arguments.done",
                response_id=self.id,
                item_id=item.id,
                output_index=index,
                **call,
            )
            public = item.public(done)
            await send("response.output_item.done", response_id=self.id, output_index=index, item=public)
            await send("conversation.item.done", item=public)
        await send("response.done", response=self.public(status, details, usage))

    async def _finish_message(self, send: Send, status: str) -> None:
        where, text = self.where, self.item.text or ""
        if self.speaks:
            await send("response.output_audio.done", **where)
            await send("response.output_audio_transcript.done", **where, transcript=text)
            part = {"type": "audio", "transcript": text}
        else:
            await send("response.output_text.done", **where, text=text)
            part = {"type": "text", "text": text}
        await send("response.content_part.done", **where, part=part)
        item = self.item.public(status)
        await send(
            "response.output_item.done", response_id=self.id, output_index=where["output_index"], item=item
        )
        await send("conversation.item.done", item=item)


def _deltas(reader: Reader | None, out: Any) -> list[Delta]:
    """The output's text as content and calls (all content where no calls are read)."""
    if reader is None:
        return [Delta("content", out.delta_text)] if out.delta_text else []
    return reader.feed(out.delta_text or "") + (reader.finish() if out.finished else [])


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
