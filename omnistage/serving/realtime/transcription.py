"""The transcript of a user's audio item (`input_audio_transcription`), by a served transcription model.

A model that does not hear audio itself is answered from the transcript, so its session needs one: the
session's `audio.input.transcription.model`, else the first served model that serves transcriptions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omnistage.errors import InvalidRequestError
from omnistage.serving.context import ServerContext
from omnistage.serving.served import ServedModel

ROUTE = "transcriptions"
PARAM = "session.audio.input.transcription.model"


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
    """The transcript of 24 kHz mono `samples`."""
    model = transcriber(ctx, wanted.model if wanted is not None else None)
    raise InvalidRequestError(f"{PARAM}: {model.name!r} cannot transcribe yet", param=PARAM)
