"""Listening to what the server says: pocketsphinx's trained English recogniser and word error rate."""

from __future__ import annotations

import numpy as np

from omnistage.bench.wer import word_errors, words

__all__ = ["transcribe", "wer", "word_errors", "words"]

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


def wer(reference: str, hypothesis: str) -> float:
    errors, total = word_errors(reference, hypothesis)
    return errors / max(total, 1)
