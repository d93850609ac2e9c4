"""A voice clip as a cloning stage reads it: bytes a request carried, or a voice file (an uploaded voice in
the server's store), as mono float samples at the model's rate; a 400 naming the field when it is not
audio or is empty."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from omnistage.errors import InvalidRequestError


def mono_clip(data: bytes | bytearray | str | Path, rate: int, param: str) -> np.ndarray:
    from omnistage.media import decode_audio, resample, voice_samples

    try:
        samples, given = voice_samples(data) if isinstance(data, str | Path) else decode_audio(bytes(data))
    except Exception as exc:  # whatever the decoder makes of bytes that are not audio
        raise InvalidRequestError(f"{param}: not a readable audio clip ({exc})", param=param) from None
    samples = samples.mean(axis=0) if samples.ndim == 2 else samples
    if given != rate:
        samples = resample(samples, given, rate)
    if len(samples) == 0:
        raise InvalidRequestError(f"{param}: the clip is empty", param=param)
    return np.ascontiguousarray(samples, dtype=np.float32)
