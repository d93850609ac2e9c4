"""The session's parts on their own: the pcm16 buffer's positions across takes and clears, and the silero
detector's independence from how the audio was chunked."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from omnistage.serving.realtime.audio import AudioBuffer, decode_pcm16
from omnistage.serving.realtime.events import BadEvent
from omnistage.serving.realtime.vad import STEP, SpeechDetector

pytestmark = pytest.mark.unit


def test_buffer_keeps_session_positions_across_takes_and_clears():
    buffer = AudioBuffer(max_seconds=1.0)
    samples = np.arange(1000, dtype=np.float32)
    buffer.append(samples[:600])
    buffer.append(samples[600:])
    np.testing.assert_array_equal(buffer.take(100, 400), samples[100:400])
    assert (buffer.start, buffer.size) == (400, 600)
    buffer.clear()
    assert (buffer.start, buffer.size, buffer.end) == (1000, 0, 1000)
    with pytest.raises(BadEvent) as over:
        buffer.append(np.zeros(24001, np.float32))
    assert over.value.code == "input_audio_buffer_too_large" and buffer.size == 0


def test_pcm16_is_decoded_exactly_and_odd_bytes_are_refused():
    pcm = np.array([-32768, -1, 0, 1, 32767], "<i2")
    decoded = decode_pcm16(base64.b64encode(pcm.tobytes()).decode())
    np.testing.assert_array_equal(decoded * 32768, pcm.astype(np.float32))
    with pytest.raises(BadEvent) as odd:
        decode_pcm16(base64.b64encode(b"\x00\x01\x02").decode())
    assert odd.value.code == "invalid_audio_format"


def test_detector_events_do_not_depend_on_chunking():
    rng = np.random.default_rng(0)
    t = np.arange(24000 * 3) / 24000
    # A voiced, syllable-like burst (harmonics under a 4 Hz envelope) between two silences.
    voiced = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 12)) * (np.sin(2 * np.pi * 4 * t) > 0)
    audio = np.concatenate([np.zeros(24000), 0.3 * voiced, np.zeros(36000)]).astype(np.float32)
    whole = SpeechDetector(0.5, 300, 500).feed(audio)
    chunked, detector, i = [], SpeechDetector(0.5, 300, 500), 0
    while i < len(audio):
        n = int(rng.integers(480, 2401))
        chunked += detector.feed(audio[i : i + n])
        i += n
    assert [(e.kind, e.position) for e in chunked] == [(e.kind, e.position) for e in whole]
    assert [e.kind for e in whole] == ["started", "stopped"]
    # Speech starts in the window holding the burst's first sample, less the 300 ms prefix padding.
    assert whole[0].position >= 24000 - STEP - 7200 and whole[1].position % STEP == 0
    assert SpeechDetector(0.5, 300, 500).feed(np.zeros(48000, np.float32)) == []
