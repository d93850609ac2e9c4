"""The transcript of a user's audio item (`input_audio_transcription`), by a served transcription model.

It is the request `/v1/audio/transcriptions` makes for the same audio (the route's prompt, greedy unless the
session says otherwise, the same joined segments), so a session's transcript is exactly what that route
answers for the committed audio. A model that does not hear audio itself is answered from this transcript,
so its session needs a transcriber: `audio.input.transcription.model`, else the first served model that
serves transcriptions.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np

from omnistage.errors import InvalidRequestError
from omnistage.media import resample
from omnistage.prompts import AudioPrompt
from omnistage.serving import transcripts
from omnistage.serving.context import ServerContext
from omnistage.serving.generation import generate, last_output
from omnistage.serving.realtime.events import SAMPLE_RATE
from omnistage.serving.served import ServedModel
from omnistage.serving.stage_params import build_stage_params

ROUTE = "transcriptions"
PARAM = "session.audio.input.transcription.model"
TRANSCRIPTION_RATE = 16000  # what the transcriptions capability's `audio` prompt holds


def transcriber(ctx: ServerContext, name: str | None) -> ServedModel:
    """The served model that transcribes for a session; 400 naming the field if there is none."""
    if name is not None and name not in {m.name for m in ctx.models}:
        raise InvalidRequestError(f"{PARAM}: the model `{name}` is not served", param=PARAM)
    for model in ctx.models:
        if (name is None or model.name == name) and model.capabilities.serves(ROUTE):
            return model
    which = f"model {name!r} does not transcribe audio" if name else "no served model transcribes audio"
    raise InvalidRequestError(f"{PARAM}: {which} (it must serve /v1/audio/transcriptions)", param=PARAM)


async def transcribe(ctx: ServerContext, wanted: Any, samples: np.ndarray) -> str:
    """The transcript of 24 kHz mono `samples` (`wanted`: the session's transcription settings or None)."""
    model = transcriber(ctx, wanted.model if wanted is not None else None)
    audio = await asyncio.to_thread(resample, samples, SAMPLE_RATE, TRANSCRIPTION_RATE)
    prompt = AudioPrompt(
        audio=audio,
        language=wanted.language if wanted is not None else None,
        prompt=wanted.prompt if wanted is not None else None,
    )
    params = build_stage_params(model, sampling={"temperature": 0.0}, limits=model.limits(ctx.settings))
    request_id = f"transcription-{uuid.uuid4().hex}"
    out = await last_output(generate(model, ctx.metrics, prompt, params, request_id, ["text"]))
    return transcripts.full_text(transcripts.segments_of(out, set()))
