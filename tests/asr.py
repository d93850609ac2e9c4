"""Listening to what the server says: pocketsphinx's trained English recogniser and word error rate."""

from __future__ import annotations

import re

import numpy as np

ASR_RATE = 16000


def transcribe(samples: np.ndarray, sample_rate: int) -> str:
    """pocketsphinx's transcription of mono float samples (resampled to its 16 kHz)."""
    from pocketsphinx import Decoder

    samples = np.asarray(samples, dtype=np.float64).reshape(-1)
    n = int(round(len(samples) * ASR_RATE / sample_rate))
    resampled = np.interp(np.linspace(0, len(samples) - 1, n), np.arange(len(samples)), samples)
    pcm = (np.clip(resampled, -1, 1) * 32767).astype("<i2").tobytes()
    decoder = Decoder(samprate=ASR_RATE, loglevel="FATAL")
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return hyp.hypstr if hyp else ""


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit distance in words, reference length)."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)], len(ref)


def wer(reference: str, hypothesis: str) -> float:
    errors, total = word_errors(reference, hypothesis)
    return errors / max(total, 1)
