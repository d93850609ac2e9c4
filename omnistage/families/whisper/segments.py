"""Cutting long audio into the <= 30 s segments Whisper's encoder takes, at pauses silero VAD hears.

Audio of 30 s or less is one segment, untouched (as transformers' short-form `generate` sees it). Longer
audio: silero VAD's speech spans (each itself under 30 s) are joined greedily into segments while a
segment stays <= PACK_S, so cuts fall in silence and the silence between segments is skipped. The cut is a
pure function of the samples: every stage that needs it computes the same one.
"""

from __future__ import annotations

import functools

import numpy as np

SAMPLE_RATE = 16000
MAX_SEGMENT_S = 30.0
# Speech spans are joined up to this length: without timestamp tokens Whisper tends to skip sentences in a
# segment packed with ~30 s of dense speech (measured here on hibari speech: 58 of 87 words lost at 29 s
# segments); shorter segments cost more encoder passes (each pads to 30 s) but lose nothing.
PACK_S = 15.0


@functools.cache
def _vad():
    from silero_vad import load_silero_vad

    return load_silero_vad(onnx=True)  # the ONNX file shipped in the wheel, on onnxruntime


def segment_bounds(
    audio: np.ndarray, max_s: float = MAX_SEGMENT_S, pack_s: float = PACK_S
) -> list[tuple[int, int]]:
    """[(first sample, end sample)] of each segment of 16 kHz `audio`."""
    limit = int(max_s * SAMPLE_RATE)
    pack = int(min(pack_s, max_s) * SAMPLE_RATE)
    if len(audio) <= limit:
        return [(0, len(audio))]
    import torch
    from silero_vad import get_speech_timestamps

    spans = get_speech_timestamps(
        torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)),
        _vad(),
        sampling_rate=SAMPLE_RATE,
        max_speech_duration_s=max_s - 1.0,
    )
    if not spans:  # no speech heard: the first window, so the request still has something to decode
        return [(0, limit)]
    segments: list[tuple[int, int]] = []
    start, end = spans[0]["start"], spans[0]["end"]
    for span in spans[1:]:
        if span["end"] - start <= pack:
            end = span["end"]
        else:
            segments.append((start, end))
            start, end = span["start"], span["end"]
    segments.append((start, min(end, start + limit)))
    return segments
