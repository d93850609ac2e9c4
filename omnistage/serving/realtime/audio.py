"""The session's input audio buffer: base64 pcm16 at 24 kHz in, float samples out.

Positions are kept in samples since the session's first append, so the VAD's times (`audio_start_ms`,
`audio_end_ms`) stay meaningful across commits and clears, as the API defines them.
"""

from __future__ import annotations

import base64
import binascii

import numpy as np

from omnistage.serving.realtime.events import SAMPLE_RATE, BadEvent


def decode_pcm16(text: object, param: str = "audio") -> np.ndarray:
    """Float32 samples in [-1, 1] of a base64 pcm16 (little-endian, mono) string."""
    if not isinstance(text, str) or not text:
        raise BadEvent(f"{param}: needs a non-empty base64 string of pcm16 audio", param)
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadEvent(f"{param}: not valid base64 ({exc})", param, "invalid_base64") from None
    if len(data) % 2:
        raise BadEvent(
            f"{param}: {len(data)} bytes is not whole pcm16 samples (audio/pcm is 16-bit mono at 24 kHz)",
            param,
            "invalid_audio_format",
        )
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def encode_pcm16(samples: np.ndarray) -> str:
    pcm = (np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
    return base64.b64encode(pcm).decode("ascii")


def ms(samples: int) -> int:
    return samples * 1000 // SAMPLE_RATE


class AudioBuffer:
    """Appended audio not yet committed, bounded by `max_seconds`."""

    def __init__(self, max_seconds: float):
        self.max_samples = int(max_seconds * SAMPLE_RATE)
        self.chunks: list[np.ndarray] = []
        self.size = 0
        self.start = 0  # session position (samples) of the buffer's first sample

    @property
    def end(self) -> int:
        return self.start + self.size

    def append(self, samples: np.ndarray) -> None:
        if self.size + len(samples) > self.max_samples:
            limit = self.max_samples / SAMPLE_RATE
            raise BadEvent(
                f"audio: the input buffer would hold {(self.size + len(samples)) / SAMPLE_RATE:.2f} s, over "
                f"the limit of {limit:g} s; commit or clear it first",
                "audio",
                "input_audio_buffer_too_large",
            )
        self.chunks.append(samples)
        self.size += len(samples)

    def peek(self, start: int | None = None, end: int | None = None) -> np.ndarray:
        """The samples between session positions `start` and `end` (default: all), left in the buffer."""
        return self._whole()[self._offset(start, self.start) : self._offset(end, self.end)]

    def take(self, start: int | None = None, end: int | None = None) -> np.ndarray:
        """The samples between session positions `start` and `end` (default: all); everything before `end`
        leaves the buffer."""
        whole = self._whole()
        hi = self._offset(end, self.end)
        taken = whole[self._offset(start, self.start) : hi]
        rest = whole[hi:]
        self.chunks = [rest] if len(rest) else []
        self.start += hi
        self.size = len(rest)
        return taken

    def _whole(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)

    def _offset(self, position: int | None, default: int) -> int:
        return min(self.size, max(0, (position if position is not None else default) - self.start))

    def clear(self) -> None:
        self.start, self.chunks, self.size = self.end, [], 0
