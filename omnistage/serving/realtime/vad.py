"""Server VAD: silero-vad's ONNX model (shipped in its wheel) run on onnxruntime, one state per session.

Speech starts at the first 32 ms window whose speech probability reaches the threshold and stops once
`silence_duration_ms` have stayed under it (less 0.15, silero's own hysteresis). The model sees 16 kHz:
each 768-sample window of the API's 24 kHz audio is resampled to its 512 samples.

A turn's audio ends `END_PADDING_MS` after the speech (the quiet past that is only the wait that tells a
pause from the turn's end), so it is known as soon as the speech pauses: the detector reports the pause
("paused", with the turn's end position should the pause last) and, if speech comes back before the
silence wait is over, "resumed". A session can start on the turn (its transcript) at the pause, and it is
exactly the audio "stopped" then ends the turn with.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from typing import Any

import numpy as np

from omnistage.serving.realtime.events import SAMPLE_RATE

VAD_RATE = 16000
WINDOW = 512  # samples at 16 kHz
STEP = WINDOW * SAMPLE_RATE // VAD_RATE  # the same 32 ms at 24 kHz
CONTEXT = 64
HYSTERESIS = 0.15
END_PADDING_MS = 128  # the quiet kept after the speech in a turn's audio (four windows)


@functools.cache
def silero_session() -> Any:
    """One onnxruntime session for every detector (it is stateless; the recurrent state is the caller's)."""
    import onnxruntime

    path = resources.files("silero_vad.data").joinpath("silero_vad.onnx")
    options = onnxruntime.SessionOptions()
    options.inter_op_num_threads = options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


@dataclasses.dataclass
class VadEvent:
    kind: str  # "started" | "paused" | "resumed" | "stopped"
    position: int  # session position in samples: where speech (with its prefix padding) began; where the
    # turn's audio ends (paused, stopped: the speech and its end padding); where speech resumed


class SpeechDetector:
    """Feeds 24 kHz samples in any chunking; returns the speech starts and stops they complete."""

    def __init__(self, threshold: float, prefix_padding_ms: int, silence_duration_ms: int, position: int = 0):
        self.threshold = threshold
        self.prefix = prefix_padding_ms * SAMPLE_RATE // 1000
        self.silence = silence_duration_ms * SAMPLE_RATE // 1000
        self.position = position  # session position of the first sample not yet run
        self.pending = np.zeros(0, np.float32)
        self.state = np.zeros((2, 1, 128), np.float32)
        self.context = np.zeros((1, CONTEXT), np.float32)
        self.tail = min(self.silence, END_PADDING_MS * SAMPLE_RATE // 1000)
        self.speaking = False
        self.quiet_since: int | None = None
        self.paused = False  # "paused" was reported for the current quiet stretch

    def feed(self, samples: np.ndarray) -> list[VadEvent]:
        self.pending = np.concatenate([self.pending, samples.astype(np.float32)])
        events = []
        while len(self.pending) >= STEP:
            window, self.pending = self.pending[:STEP], self.pending[STEP:]
            start, self.position = self.position, self.position + STEP
            prob = self.probability(window)
            if not self.speaking and prob >= self.threshold:
                self.speaking, self.quiet_since = True, None
                events.append(VadEvent("started", max(0, start - self.prefix)))
            elif self.speaking and prob < self.threshold - HYSTERESIS:
                self.quiet_since = start if self.quiet_since is None else self.quiet_since
                end = self.quiet_since + self.tail
                if self.position - self.quiet_since >= self.silence:
                    self.speaking, self.quiet_since, self.paused = False, None, False
                    events.append(VadEvent("stopped", end))
                elif not self.paused and self.position >= end:
                    self.paused = True
                    events.append(VadEvent("paused", end))
            elif self.speaking:
                if self.paused:
                    events.append(VadEvent("resumed", start))
                self.quiet_since, self.paused = None, False
        return events

    def probability(self, window: np.ndarray) -> float:
        """Silero's speech probability of one 32 ms window (24 kHz samples)."""
        x16 = np.interp(np.arange(WINDOW) * (STEP / WINDOW), np.arange(STEP), window).astype(np.float32)
        x = np.concatenate([self.context, x16[None, :]], axis=1)
        inputs = {"input": x, "state": self.state, "sr": np.array(VAD_RATE, dtype=np.int64)}
        out, self.state = silero_session().run(None, inputs)
        self.context = x[:, -CONTEXT:]
        return float(out.reshape(-1)[0])
