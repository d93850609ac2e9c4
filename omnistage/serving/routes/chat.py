"""POST /v1/chat/completions: text, audio and image outputs, plain or streamed (SSE).

One route serves every pipeline: what the model's `Capabilities` say its entry stage takes decides the
prompt — chat messages (with decoded media), or the last user text with generation fields (top level or
nested in `extra_body`). `n > 1` fans out into n runtime requests (seeds offset by the choice index), or
into a text-prompted model's number of outputs. Without `max_tokens` a reply runs up to the model's
context (its stage caps it at the context minus the prompt), as vLLM does.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError

from omnistage.errors import InvalidRequestError, OmniError
from omnistage.media import encode_image, encode_video
from omnistage.outputs import OmniRequestOutput, Progress
from omnistage.serving.artifacts import audio_of, fps_of, images_of, sample_rate_of, videos_of
from omnistage.serving.chat_prompt import ChatPrompt, build_chat_prompt
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.errors import SchemaError, omni_error_body
from omnistage.serving.generation import collect, generate, merge, prime, unless_disconnected
from omnistage.serving.logprobs import TokenLogprobs
from omnistage.serving.media import data_url, encode_audio
from omnistage.serving.prompt_tokens import check_chat_tokens
from omnistage.serving.protocol import ChatCompletionRequest, ChatDiffusionExtras
from omnistage.serving.routes.videos import soundtrack_of
from omnistage.serving.served import ServedModel
from omnistage.serving.sse import DONE, SSE_HEADERS, sse
from omnistage.serving.stage_params import (
    build_stage_params,
    diffusion_fields,
    diffusion_origins,
    sampling_fields,
)
from omnistage.serving.structured_outputs import structured_outputs_of
from omnistage.serving.tool_calls import ToolPlan, plan_tools, request_tools, tool_parser_of
from omnistage.serving.tool_parsers import Reader, read_whole

router = APIRouter()
AUDIO_EXPIRY_S = 24 * 3600


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, ctx: ServerContext = Depends(get_context)
):
    if body.top_logprobs is not None and not body.logprobs:
        raise InvalidRequestError("top_logprobs: needs logprobs set to true", param="top_logprobs")
    requested = body.modalities or (["text", "audio"] if body.audio else None)
    model = ctx.models.get(body.model, produces=requested or (), route="/v1/chat/completions", serves="chat")
    modalities = requested or model.default_modalities()
    limits = model.limits(ctx.settings)
    chat = await build_chat_prompt(body.messages, ctx.media, ctx.settings, limits)
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    tools = _tool_plan(body, model, ctx)
    plans = _plan(body, model, chat, ctx, tools)
    streams = [
        generate(
            model,
            ctx.metrics,
            prompt,
            params,
            request_id if len(plans) == 1 else f"{request_id}-{i}",
            modalities,
        )
        for i, (prompt, params) in enumerate(plans)
    ]
    logprobs = TokenLogprobs(model.tokenizer) if body.logprobs else None
    reply = _Reply(request_id, model.name, _audio_format(body), "text" in modalities, logprobs)
    reply.readers = [tools.reader() for _ in plans]
    if body.stream:
        primed = await unless_disconnected(request, prime(streams))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        events = _stream_events(reply, primed, include_usage)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    outputs = await unless_disconnected(request, collect(streams))
    # Encoding its audio and media (mp3: seconds) and rendering the JSON: off the event loop.
    return await asyncio.to_thread(lambda: JSONResponse(reply.completion(outputs)))


def _tool_plan(body: ChatCompletionRequest, model: ServedModel, ctx: ServerContext) -> ToolPlan:
    """The request's tools against what the model takes (its parser, or the server's `--tool-call-parser`
    for a model that takes tools)."""
    parser = tool_parser_of(model.capabilities, ctx.settings)
    tools, choice = request_tools(body)
    return plan_tools(
        tools, choice, body.parallel_tool_calls, parser, model.name, structured_outputs_of(body)
    )


def _plan(
    body: ChatCompletionRequest, model: ServedModel, chat: ChatPrompt, ctx: ServerContext, tools: ToolPlan
) -> list[tuple]:
    """(prompt, per-stage params) for each runtime request this chat request becomes: one for a model
    prompted with text (`n` becomes its number of outputs), `n` for one prompted with chat messages."""
    limits = model.limits(ctx.settings)
    if model.capabilities.prompt == "text":
        extras = _diffusion_extras(body)
        fields = diffusion_fields(
            extras,
            seed=extras.seed,
            num_outputs=extras.num_outputs_per_prompt or (body.n if body.n > 1 else None),
            images=chat.media["image"] or None,
            lora=ctx.loras.for_model(model, extras.lora),
        )
        params = build_stage_params(
            model,
            diffusion=fields,
            stage_params=body.stage_params,
            limits=limits,
            origins=diffusion_origins(extras),
        )
        return [(chat.last_user_text(), params)]
    voice = body.audio.voice if body.audio and isinstance(body.audio.voice, str) else None
    voices = model.capabilities.voices
    if voice and voices and "audio" in (body.modalities or ["audio"]) and voice not in voices:
        raise InvalidRequestError(
            f"audio.voice: unknown voice {voice!r}; model {model.name!r} has {list(voices)}",
            param="audio.voice",
        )
    prompt = chat.as_prompt(speaker=body.speaker or body.voice or voice, tools=tools.tools)
    check_chat_tokens(model, chat.messages, limits, tools.tools)
    lora = ctx.loras.for_model(model, body.lora) if body.lora is not None else None
    diffusion = diffusion_fields(body, seed=body.seed, lora=lora)  # an AR → DiT pipeline's DiT
    max_tokens = body.max_completion_tokens or body.max_tokens
    plans = []
    for i in range(body.n):
        sampling = sampling_fields(body, max_tokens=max_tokens)
        if body.logprobs:
            sampling["logprobs"] = body.top_logprobs or 0
        if body.seed is not None:
            sampling["seed"] = body.seed + i
        if tools.constraint is not None:  # a required or named call: its JSON, by grammar
            sampling["structured_outputs"] = tools.constraint
        params = build_stage_params(
            model,
            sampling=sampling,
            diffusion=diffusion,
            stage_params=body.stage_params,
            route_defaults={"max_tokens": None},
            limits=limits,
            origins={
                **diffusion_origins(body),
                "max_tokens": "max_completion_tokens" if body.max_completion_tokens else "max_tokens",
            },
        )
        plans.append((prompt, params))
    return plans


def _diffusion_extras(body: ChatCompletionRequest) -> ChatDiffusionExtras:
    """Top-level generation fields, completed by those nested in `extra_body` (top level wins)."""
    nested = body.extra_body or {}
    try:
        extras = ChatDiffusionExtras.model_validate(nested)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = "extra_body." + ".".join(str(p) for p in first["loc"])
        raise SchemaError(f"{field}: {first['msg']}", param=field) from exc
    top = {
        name: getattr(body, name)
        for name in ChatDiffusionExtras.model_fields
        if getattr(body, name, None) is not None
    }
    return extras.model_copy(update=top)


def _audio_format(body: ChatCompletionRequest) -> str:
    fmt = body.audio.format if body.audio else "wav"
    return "pcm" if fmt == "pcm16" else fmt


class _Reply:
    """Builds the response objects of one chat request."""

    def __init__(
        self,
        request_id: str,
        model: str,
        audio_format: str,
        text_out: bool = True,
        logprobs: TokenLogprobs | None = None,
    ):
        self.id = request_id
        self.text_out = text_out
        self.logprobs = logprobs
        self.model = model
        self.audio_format = audio_format
        self.created = int(time.time())
        self.readers: list[Reader | None] = []  # per choice, where the request reads tool calls

    def completion(self, outputs: list[OmniRequestOutput]) -> dict[str, Any]:
        choices = [self._choice(i, out) for i, out in enumerate(outputs)]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": _usage(outputs),
        }

    def _choice(self, index: int, out: OmniRequestOutput) -> dict[str, Any]:
        text = out.text if self.text_out else ""
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        finish_reason, transcript = out.finish_reason or "stop", out.text
        reader = self.reader(index)
        if reader is not None and self.text_out:
            text, calls = read_whole(reader, text)
            message["content"], text = text, text or ""
            transcript = text  # what the audio says: never a call
            if calls:
                message["tool_calls"] = calls
                finish_reason = _calls_finish(finish_reason)
        media = [_image_part(img) for img in images_of(out)]
        media += [_video_part(v, fps_of(out), **soundtrack_of(out, k)) for k, v in enumerate(videos_of(out))]
        if media:
            message["content"] = ([{"type": "text", "text": text}] if text else []) + media
        samples = audio_of(out)
        if samples is not None:
            data, rate = encode_audio(samples, sample_rate_of(out), self.audio_format)
            message["audio"] = {
                "id": f"audio_{self.id}_{index}",
                "data": base64.b64encode(data).decode(),
                "expires_at": self.created + AUDIO_EXPIRY_S,
                "transcript": transcript,
                "format": self.audio_format,
                "sample_rate": rate,
            }
        return {
            "index": index,
            "message": message,
            "logprobs": self._logprobs(out.logprobs),
            "finish_reason": finish_reason,
        }

    def reader(self, index: int) -> Reader | None:
        return self.readers[index] if index < len(self.readers) else None

    def _logprobs(self, entries: list[Any]) -> dict[str, Any] | None:
        return None if self.logprobs is None else {"content": self.logprobs.content(entries)}

    def chunk(
        self,
        index: int,
        delta: dict[str, Any],
        modality: str,
        finish_reason: str | None = None,
        logprobs: list[Any] | None = None,
        progress: Progress | None = None,
    ) -> str:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "modality": modality,
            "choices": [
                {
                    "index": index,
                    "delta": delta,
                    "logprobs": self._logprobs(logprobs) if logprobs else None,
                    "finish_reason": finish_reason,
                }
            ],
        }
        if progress is not None:  # a multi-step answer (an image's denoising steps) on its way
            body["progress"] = {"step": progress.step, "total": progress.total}
        return sse(body)

    def usage_chunk(self, outputs: list[OmniRequestOutput]) -> str:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }
        return sse({**body, "choices": [], "usage": _usage(outputs)})


def _image_part(image: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url("image/png", encode_image(image, "png"))}}


def _video_part(video: Any, fps: int, **soundtrack: Any) -> dict[str, Any]:
    """An MP4 data URL, with the clip's sound track where it has one (`soundtrack_of`)."""
    mp4 = encode_video(video, fps, **soundtrack)
    return {"type": "video_url", "video_url": {"url": data_url("video/mp4", mp4)}}


def _usage(outputs: list[OmniRequestOutput]) -> dict[str, int]:
    prompt = len(outputs[0].prompt_token_ids) if outputs else 0
    completion = sum(len(out.token_ids) for out in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def _stream_events(
    reply: _Reply, streams: list[AsyncIterator[OmniRequestOutput]], include_usage: bool
) -> AsyncIterator[str]:
    finals: list[OmniRequestOutput | None] = [None] * len(streams)
    logprobs_sent = [0] * len(streams)
    progressed: list[Progress | None] = [None] * len(streams)
    for index in range(len(streams)):
        yield reply.chunk(index, {"role": "assistant", "content": ""}, "text")
    try:
        async for index, out in merge(streams):
            if out.error is not None:
                raise out.error
            if out.progress is not None and out.progress != progressed[index]:
                progressed[index] = out.progress
                yield reply.chunk(index, {}, out.modality or "image", progress=out.progress)
            for event in _delta_events(reply, index, out):
                yield event
            logprobs_sent[index] += len(out.delta_logprobs)
            if out.finished:
                finals[index] = out
                rest = out.logprobs[logprobs_sent[index] :] if reply.logprobs and reply.text_out else []
                if rest:  # tokens of the last step, reported only with the terminal output
                    yield reply.chunk(index, {"content": ""}, "text", logprobs=rest)
                finish_reason = out.finish_reason or "stop"
                reader = reply.reader(index)
                if reader is not None and reader.calls:
                    finish_reason = _calls_finish(finish_reason)
                yield reply.chunk(index, {}, out.modality or "text", finish_reason)
        if include_usage:
            yield reply.usage_chunk([f for f in finals if f is not None])
    except OmniError as exc:
        yield sse(omni_error_body(exc))
    yield DONE


def _calls_finish(finish_reason: str) -> str:
    """A reply that called tools ends with "tool_calls", unless it was cut short."""
    return finish_reason if finish_reason == "length" else "tool_calls"


def _delta_events(reply: _Reply, index: int, out: OmniRequestOutput) -> list[str]:
    events = []
    reader = reply.reader(index)
    if reader is not None and reply.text_out:
        events += _tool_reader_events(reply, index, reader, out)
    elif (out.delta_text or out.delta_logprobs) and reply.text_out:
        events.append(reply.chunk(index, {"content": out.delta_text}, "text", logprobs=out.delta_logprobs))
    samples = audio_of(out, delta=True)
    if samples is not None:
        wav, _ = encode_audio(samples, sample_rate_of(out), "wav")
        events.append(reply.chunk(index, {"content": base64.b64encode(wav).decode()}, "audio"))
    if out.finished:
        for image in images_of(out):
            events.append(
                reply.chunk(index, {"content": data_url("image/png", encode_image(image, "png"))}, "image")
            )
        for k, video in enumerate(videos_of(out)):
            url = data_url("video/mp4", encode_video(video, fps_of(out), **soundtrack_of(out, k)))
            events.append(reply.chunk(index, {"content": url}, "video"))
    return events


def _tool_reader_events(reply: _Reply, index: int, reader: Reader, out: OmniRequestOutput) -> list[str]:
    """A delta's text as the reader splits it: content, and calls as OpenAI streams them (a first delta
    with the call's id, type and name, then its arguments)."""
    deltas = reader.feed(out.delta_text) + (reader.finish() if out.finished else [])
    events, logprobs = [], out.delta_logprobs
    for delta in deltas:
        if delta.kind == "content":
            events.append(reply.chunk(index, {"content": delta.text}, "text", logprobs=logprobs))
            logprobs = []
            continue
        if delta.kind == "call":
            call = {"name": delta.name, "arguments": ""}
            entry = {"index": delta.index, "id": delta.call_id, "type": "function", "function": call}
        else:
            entry = {"index": delta.index, "function": {"arguments": delta.text}}
        events.append(reply.chunk(index, {"tool_calls": [entry]}, "text"))
    if logprobs:  # the tokens of text held back or inside a call
        events.append(reply.chunk(index, {"content": ""}, "text", logprobs=logprobs))
    return events
