"""POST /v1/audio/speech: text to speech, as a file, a raw audio stream, or SSE events.

Non-streaming answers the encoded file with usage in `x-omnistage-*` headers. `stream_format="audio"`
sends PCM (or an open-ended WAV) as the stages produce it; SSE sends `speech.audio.delta` events and ends
with exactly one `speech.audio.done` (with usage) or `speech.audio.error`.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from omnistage.errors import InvalidRequestError, OmniError
from omnistage.outputs import OmniRequestOutput
from omnistage.serving.artifacts import audio_of, sample_rate_of
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.errors import SchemaError, omni_error_body
from omnistage.serving.generation import generate, last_output, prime, unless_disconnected
from omnistage.serving.media import (
    AUDIO_CONTENT_TYPES,
    change_speed,
    encode_audio,
    pcm16,
    resample,
    wav_header,
)
from omnistage.serving.protocol import SpeechRequest
from omnistage.serving.served import ServedModel
from omnistage.serving.sse import SSE_HEADERS, sse
from omnistage.serving.stage_params import build_stage_params

logger = logging.getLogger(__name__)
router = APIRouter()


def _validate(body: SpeechRequest, model: ServedModel) -> None:
    if body.streaming and body.response_format not in ("pcm", "wav"):
        raise SchemaError(
            "response_format: streaming (stream=true or stream_format) requires 'pcm' or 'wav'",
            param="response_format",
        )
    speeds = model.capabilities.speed_range
    if speeds is not None and not speeds[0] <= body.speed <= speeds[1]:
        raise InvalidRequestError(
            f"speed: model {model.name!r} speaks at speeds in [{speeds[0]}, {speeds[1]}], got {body.speed}",
            param="speed",
        )
    if speeds is None and body.streaming and body.speed != 1.0:
        raise SchemaError("speed: streaming requires speed 1.0", param="speed")
    if not body.input.strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")


def _request(body: SpeechRequest, model: ServedModel, ctx: ServerContext) -> tuple[Any, list]:
    """(prompt, per-stage params). A model prompted with text (text-to-audio) gets the input text; any other
    a speech prompt dict (the text as `input` and as a user message, with `speaker`, `instructions`,
    `language`): a chat-capable pipeline (an omni thinker) reads `messages`, a TTS family the rest."""
    caps = model.capabilities
    voice = body.voice_name
    if voice and caps.voices and voice not in caps.voices:
        raise InvalidRequestError(
            f"voice: unknown voice {voice!r}; this model has {list(caps.voices)}", param="voice"
        )
    limits = model.limits(ctx.settings)
    seed = {"seed": body.seed} if body.seed is not None else {}
    if caps.prompt == "text":
        params = build_stage_params(model, diffusion=seed, stage_params=body.stage_params, limits=limits)
        return body.input, params
    prompt = {"task": "speech", "input": body.input, "messages": [{"role": "user", "content": body.input}]}
    extras = {"speaker": voice, "instructions": body.instructions, "language": body.language}
    prompt.update({k: v for k, v in extras.items() if v})
    if caps.speed_range is not None:  # the model speaks at the asked speed itself
        prompt["speed"] = body.speed
    sampling = {**seed, **({"max_tokens": body.max_new_tokens} if body.max_new_tokens is not None else {})}
    params = build_stage_params(
        model,
        sampling=sampling,
        generation=seed,
        stage_params=body.stage_params,
        route_defaults={"max_tokens": None},  # as chat: the whole answer, up to the context
        limits=limits,
        origins={"max_tokens": "max_new_tokens"},
    )
    return prompt, params


def _usage(out: OmniRequestOutput | None) -> dict[str, Any]:
    text_tokens = len(out.prompt_token_ids) if out else 0
    audio_in = int(out.data.get("input_audio_tokens", 0)) if out else 0
    # Codec tokens when the pipeline reports them (a talker is not a final stage), else text tokens.
    output = int(out.data.get("num_output_tokens", len(out.token_ids))) if out else 0
    return {
        "input_tokens": text_tokens + audio_in,
        "output_tokens": output,
        "total_tokens": text_tokens + audio_in + output,
        "input_token_details": {"text_tokens": text_tokens, "audio_tokens": audio_in},
    }


def _usage_headers(usage: dict[str, Any]) -> dict[str, str]:
    return {
        "x-omnistage-input-tokens": str(usage["input_tokens"]),
        "x-omnistage-output-tokens": str(usage["output_tokens"]),
        "x-omnistage-total-tokens": str(usage["total_tokens"]),
        "x-omnistage-input-text-tokens": str(usage["input_token_details"]["text_tokens"]),
        "x-omnistage-input-audio-tokens": str(usage["input_token_details"]["audio_tokens"]),
    }


@router.post("/v1/audio/speech")
async def create_speech(body: SpeechRequest, request: Request, ctx: ServerContext = Depends(get_context)):
    model = ctx.models.get(body.model, produces=["audio"], route="/v1/audio/speech", serves="speech")
    _validate(body, model)
    prompt, params = _request(body, model, ctx)
    stream = generate(model, ctx.metrics, prompt, params, f"speech-{uuid.uuid4().hex}", ["audio"])
    if not body.streaming:
        out = await unless_disconnected(request, last_output(stream))
        samples = audio_of(out)
        if samples is None:
            raise OmniError("the model did not produce audio")
        rate = sample_rate_of(out)
        if model.capabilities.speed_range is None:
            samples = change_speed(samples, rate, body.speed)
        if body.sample_rate:
            samples, rate = resample(samples, rate, body.sample_rate), body.sample_rate
        data, rate = encode_audio(samples, rate, body.response_format)
        headers = {**_usage_headers(_usage(out)), "x-omnistage-sample-rate": str(rate)}
        return Response(data, media_type=AUDIO_CONTENT_TYPES[body.response_format], headers=headers)
    (primed,) = await unless_disconnected(request, prime([stream]))
    if body.stream_format == "audio":
        media_type = AUDIO_CONTENT_TYPES[body.response_format]
        return StreamingResponse(_audio_bytes(primed, body), media_type=media_type)
    return StreamingResponse(_sse_events(primed, body), media_type="text/event-stream", headers=SSE_HEADERS)


def _chunk(out: OmniRequestOutput, body: SpeechRequest) -> tuple[Any, int]:
    """The new samples of an output (at the requested rate) or None."""
    samples, rate = audio_of(out, delta=True), sample_rate_of(out)
    if samples is not None and body.sample_rate and body.sample_rate != rate:
        samples, rate = resample(samples, rate, body.sample_rate), body.sample_rate
    return samples, rate


async def _audio_bytes(stream: AsyncIterator[OmniRequestOutput], body: SpeechRequest) -> AsyncIterator[bytes]:
    """Raw PCM, or a WAV whose header declares an open length. A failure mid-stream breaks the
    connection (a truncated chunked body), the only error signal raw audio has."""
    header_sent = False
    async for out in stream:
        if out.error is not None:
            logger.warning("speech stream failed: %s", out.error.message)
            raise out.error
        samples, rate = _chunk(out, body)
        if body.response_format == "wav" and not header_sent:
            header_sent = True
            yield wav_header(rate)
        if samples is not None:
            yield pcm16(samples)


async def _sse_events(stream: AsyncIterator[OmniRequestOutput], body: SpeechRequest) -> AsyncIterator[str]:
    final = None
    try:
        async for out in stream:
            if out.error is not None:
                raise out.error
            samples, rate = _chunk(out, body)
            if samples is not None:
                data = (
                    pcm16(samples) if body.response_format == "pcm" else encode_audio(samples, rate, "wav")[0]
                )
                event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
                yield sse(
                    {**event, "response_format": body.response_format, "sample_rate": rate},
                    "speech.audio.delta",
                )
            if out.finished:
                final = out
    except OmniError as exc:
        error = omni_error_body(exc)["error"]
        yield sse({"type": "speech.audio.error", "error": error}, "speech.audio.error")
        return
    yield sse({"type": "speech.audio.done", "usage": _usage(final)}, "speech.audio.done")
