"""POST /v1/audio/transcriptions and /v1/audio/translations: speech in, text out.

Served by any model whose capabilities list the route (`transcriptions`, `translations`: audio in, text
out). The upload is decoded (WAV/FLAC/OGG by libsndfile, MP3/WebM/M4A and the rest by FFmpeg through
PyAV), mixed to mono, resampled to 16 kHz and checked against the model's limits; the model gets the audio
prompt dict (config/capabilities.py). `stream=true` answers SSE `transcript.text.delta` events (segments in
order) and exactly one `transcript.text.done`, or an `error` event.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from omnistage.errors import InvalidRequestError, OmniError
from omnistage.media import resample
from omnistage.outputs import OmniRequestOutput
from omnistage.prompts import AudioPrompt
from omnistage.serving import transcripts
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.errors import omni_error_body
from omnistage.serving.forms import files, read_form, text_fields
from omnistage.serving.generation import generate, last_output, prime, unless_disconnected
from omnistage.serving.limits import check_audio, check_upload
from omnistage.serving.media import decode_audio
from omnistage.serving.served import ServedModel
from omnistage.serving.sse import SSE_HEADERS, sse
from omnistage.serving.stage_params import build_stage_params

logger = logging.getLogger(__name__)
router = APIRouter()
SAMPLE_RATE = 16000
FIELDS = {"model", "language", "prompt", "temperature", "response_format", "stream"}
GRANULARITIES = ("timestamp_granularities[]", "timestamp_granularities")
FORM_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        **{name: {"type": "string"} for name in sorted(FIELDS)},
                        "timestamp_granularities[]": {"type": "array", "items": {"type": "string"}},
                    },
                }
            }
        },
    }
}


@router.post("/v1/audio/transcriptions", openapi_extra=FORM_DOC)
async def create_transcription(request: Request, ctx: ServerContext = Depends(get_context)):
    return await _answer(request, ctx, "transcribe")


@router.post("/v1/audio/translations", openapi_extra=FORM_DOC)
async def create_translation(request: Request, ctx: ServerContext = Depends(get_context)):
    return await _answer(request, ctx, "translate")


async def _answer(request: Request, ctx: ServerContext, task: str) -> Response:
    route = "transcriptions" if task == "transcribe" else "translations"
    form = await read_form(request)
    fields = text_fields(form, {"file"})
    granularities = [g for name in GRANULARITIES for g in form.getlist(name)]
    unknown = sorted(set(fields) - FIELDS - set(GRANULARITIES))
    if unknown:
        raise InvalidRequestError(f"{unknown[0]}: not a field of /v1/audio/{route}", param=unknown[0])
    if task == "translate" and "language" in fields:
        raise InvalidRequestError("language: translations are always into English", param="language")
    model = ctx.models.get(fields.get("model"), produces=["text"], route=f"/v1/audio/{route}", serves=route)
    fmt = fields.get("response_format") or "json"
    if fmt not in transcripts.RESPONSE_FORMATS:
        raise InvalidRequestError(
            f"response_format must be one of {', '.join(transcripts.RESPONSE_FORMATS)}, got {fmt!r}",
            param="response_format",
        )
    _check_granularities(granularities, fmt)
    stream = _flag(fields.get("stream"), "stream")
    if stream and fmt not in ("json", "text"):
        raise InvalidRequestError(
            f"stream: streamed transcripts are text deltas; response_format {fmt!r} cannot stream",
            param="stream",
        )
    temperature = _temperature(fields.get("temperature"))
    uploads = await files(form, "file")
    if len(uploads) != 1:
        raise InvalidRequestError("file: send exactly one audio file", param="file")
    audio = await asyncio.to_thread(_audio, uploads[0][1], model, ctx)  # decoding: off the event loop
    seconds = len(audio) / SAMPLE_RATE
    language = fields.get("language") or None
    prompt = AudioPrompt(audio=audio, language=language, task=task, prompt=fields.get("prompt") or None)
    sampling: dict[str, Any] = {"temperature": temperature}
    if fmt == "verbose_json":
        sampling["logprobs"] = 0  # each token's own logprob, for the segments' avg_logprob
    params = build_stage_params(model, sampling=sampling, limits=model.limits(ctx.settings))
    request_id = f"transcription-{uuid.uuid4().hex}"
    outputs = generate(model, ctx.metrics, prompt, params, request_id, ["text"])
    eos = _eos_ids(model)
    if stream:
        (primed,) = await unless_disconnected(request, prime([outputs]))
        events = _events(primed, eos, seconds)
        return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)
    out = await unless_disconnected(request, last_output(outputs))
    segments = transcripts.segments_of(out, eos)
    text = transcripts.full_text(segments)
    if fmt == "json":
        return JSONResponse({"text": text, "usage": transcripts.usage(seconds)})
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "srt":
        return PlainTextResponse(transcripts.srt(segments))
    if fmt == "vtt":
        return PlainTextResponse(transcripts.vtt(segments), media_type="text/vtt")
    language = "en" if task == "translate" else language or "en"  # translations are into English
    return JSONResponse(transcripts.verbose(segments, task, language, seconds, temperature))


def _check_granularities(values: list[str], fmt: str) -> None:
    param = "timestamp_granularities[]"
    for value in values:
        if value == "word":
            raise InvalidRequestError(f"{param}: word timestamps are not supported (segment is)", param=param)
        if value != "segment":
            raise InvalidRequestError(f"{param}: must be 'segment' or 'word', got {value!r}", param=param)
    if values and fmt != "verbose_json":
        raise InvalidRequestError(f"{param}: timestamps need response_format verbose_json", param=param)


def _flag(value: str | None, param: str) -> bool:
    if value is None or value.lower() in ("false", "0", ""):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise InvalidRequestError(f"{param}: must be true or false, got {value!r}", param=param)


def _temperature(value: str | None) -> float:
    if value is None or value == "":
        return 0.0
    try:
        t = float(value)
    except ValueError:
        raise InvalidRequestError(f"temperature: not a number: {value!r}", param="temperature") from None
    if not 0.0 <= t <= 1.0:
        raise InvalidRequestError(f"temperature: must be in [0, 1], got {t}", param="temperature")
    return t


def _audio(data: bytes, model: ServedModel, ctx: ServerContext) -> Any:
    limits = model.limits(ctx.settings)
    check_upload(len(data), limits, "file")
    samples, rate = decode_audio(data, param="file")
    check_audio(samples, rate, limits, "file")
    if not len(samples):
        raise InvalidRequestError("file: the audio has no samples", param="file")
    return resample(samples, rate, SAMPLE_RATE) if rate != SAMPLE_RATE else samples


def _eos_ids(model: ServedModel) -> set[int]:
    tokenizer = model.tokenizer
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    return {eos} if eos is not None else set()


async def _events(
    stream: AsyncIterator[OmniRequestOutput], eos: set[int], seconds: float
) -> AsyncIterator[str]:
    """The first segment's text as it is written; later segments (long audio, decoded side by side) once
    all are done, in order. The deltas join into the done event's text."""
    emitted, final = "", None
    try:
        async for out in stream:
            if out.error is not None:
                raise out.error
            if out.finished:
                final = out
            elif out.delta_text and int(out.data.get("index", 0)) == 0:
                piece = out.delta_text if emitted else out.delta_text.lstrip()
                if piece:
                    emitted += piece
                    yield sse({"type": "transcript.text.delta", "delta": piece, "logprobs": None})
    except OmniError as exc:
        yield sse({"type": "error", "error": omni_error_body(exc)["error"]})
        return
    text = transcripts.full_text(transcripts.segments_of(final, eos)) if final is not None else emitted
    rest = text[len(emitted) :] if text.startswith(emitted) else ""
    if rest:
        yield sse({"type": "transcript.text.delta", "delta": rest, "logprobs": None})
    done = {
        "type": "transcript.text.done",
        "text": text,
        "logprobs": None,
        "usage": transcripts.usage(seconds),
    }
    yield sse(done)
