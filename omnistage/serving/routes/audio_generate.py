"""POST /v1/audio/generate: sound or music from a text prompt (text-to-audio diffusion pipelines).

Served by models whose capabilities list the `audio_generate` route; `audio_length` reaches the pipeline
through the call argument the model declares (`Capabilities.audio_length_arg`). Answers the encoded audio.
"""

from __future__ import annotations

import asyncio
import uuid

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from omnistage.errors import InvalidRequestError, OmniError
from omnistage.serving.artifacts import audio_of, sample_rate_of
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.generation import generate, last_output, unless_disconnected
from omnistage.serving.limits import check_at_most
from omnistage.serving.media import AUDIO_CONTENT_TYPES, encode_audio
from omnistage.serving.protocol import AudioGenerateRequest
from omnistage.serving.stage_params import build_stage_params, diffusion_fields, diffusion_origins

router = APIRouter()
PATH = "/v1/audio/generate"


@router.post(PATH)
async def generate_audio(
    body: AudioGenerateRequest, request: Request, ctx: ServerContext = Depends(get_context)
) -> Response:
    model = ctx.models.get(body.model, produces=["audio"], route=PATH, serves="audio_generate")
    if not body.input.strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")
    fields = diffusion_fields(body, seed=body.seed)
    if body.audio_length is not None:
        length_arg = model.capabilities.audio_length_arg
        if length_arg is None:
            raise InvalidRequestError(
                f"audio_length: model {model.name!r} does not take an audio length", param="audio_length"
            )
        fields["extra"] = {length_arg: body.audio_length}
    limits = model.limits(ctx.settings)
    what = f"{body.audio_length} s"
    check_at_most(body.audio_length, limits, "max_output_audio_seconds", "audio_length", what)
    params = build_stage_params(model, diffusion=fields, limits=limits, origins=diffusion_origins(body))
    stream = generate(model, ctx.metrics, body.input, params, f"audio-{uuid.uuid4().hex}", ["audio"])
    out = await unless_disconnected(request, last_output(stream))
    samples = audio_of(out)
    if samples is None:
        raise OmniError("the model did not produce audio")
    data, rate = await asyncio.to_thread(encode_audio, samples, sample_rate_of(out), body.response_format)
    media_type = AUDIO_CONTENT_TYPES[body.response_format]
    return Response(data, media_type=media_type, headers={"x-omnistage-sample-rate": str(rate)})
