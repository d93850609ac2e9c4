"""POST /v1/audio/speech: text to speech, as a file, a raw audio stream, or SSE events.

Non-streaming answers the encoded file with usage in `x-omnistage-*` headers (and vLLM-Omni's
`x-vllm-omni-*`). `stream_format="audio"` sends PCM (or an open-ended WAV) as the stages produce it; SSE
sends `speech.audio.delta` events and ends with exactly one `speech.audio.done` (with usage) or
`speech.audio.error`.
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse

from omnistage.errors import OmniError
from omnistage.outputs import OmniRequestOutput
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.errors import omni_error_body
from omnistage.serving.generation import generate, prime, unless_disconnected
from omnistage.serving.media import AUDIO_CONTENT_TYPES, encode_audio, pcm16, wav_header
from omnistage.serving.protocol import SpeechRequest
from omnistage.serving.speech_requests import (
    audio_chunk,
    check_stream_format,
    speak,
    speech_request,
    speech_usage,
    usage_headers,
    validate_speech,
)
from omnistage.serving.sse import SSE_HEADERS, sse

logger = logging.getLogger(__name__)
router = APIRouter()


@router.post("/v1/audio/speech")
async def create_speech(body: SpeechRequest, request: Request, ctx: ServerContext = Depends(get_context)):
    check_stream_format(body)
    model = ctx.models.get(body.model, produces=["audio"], route="/v1/audio/speech", serves="speech")
    request_id = f"speech-{uuid.uuid4().hex}"
    if not body.streaming:
        out, data, rate = await unless_disconnected(request, speak(body, model, ctx, request_id))
        headers = {**usage_headers(speech_usage(out)), "x-omnistage-sample-rate": str(rate)}
        return Response(data, media_type=AUDIO_CONTENT_TYPES[body.response_format], headers=headers)
    validate_speech(body, model)
    prompt, params = await speech_request(body, model, ctx)
    stream = generate(model, ctx.metrics, prompt, params, request_id, ["audio"])
    (primed,) = await unless_disconnected(request, prime([stream]))
    if body.stream_format == "audio":
        media_type = AUDIO_CONTENT_TYPES[body.response_format]
        return StreamingResponse(_audio_bytes(primed, body), media_type=media_type)
    return StreamingResponse(_sse_events(primed, body), media_type="text/event-stream", headers=SSE_HEADERS)


async def _audio_bytes(stream: AsyncIterator[OmniRequestOutput], body: SpeechRequest) -> AsyncIterator[bytes]:
    """Raw PCM, or a WAV whose header declares an open length. A failure mid-stream breaks the
    connection (a truncated chunked body), the only error signal raw audio has."""
    header_sent = False
    async for out in stream:
        if out.error is not None:
            logger.warning("speech stream failed: %s", out.error.message)
            raise out.error
        samples, rate = audio_chunk(out, body)
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
            samples, rate = audio_chunk(out, body)
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
    yield sse({"type": "speech.audio.done", "usage": speech_usage(final)}, "speech.audio.done")
