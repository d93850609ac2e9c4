"""The session's parts on their own: the pcm16 buffer's positions across takes and clears, and the silero
detector's independence from how the audio was chunked, and its pauses."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from omnistage.serving.realtime.audio import AudioBuffer, decode_pcm16
from omnistage.serving.realtime.events import BadEvent
from omnistage.serving.realtime.vad import END_PADDING_MS, STEP, SpeechDetector

pytestmark = pytest.mark.unit


def test_buffer_keeps_session_positions_across_takes_and_clears():
    buffer = AudioBuffer(max_seconds=1.0)
    samples = np.arange(1000, dtype=np.float32)
    buffer.append(samples[:600])
    buffer.append(samples[600:])
    np.testing.assert_array_equal(buffer.peek(100, 400), samples[100:400])
    assert (buffer.start, buffer.size) == (0, 1000)
    np.testing.assert_array_equal(buffer.take(100, 400), samples[100:400])
    assert (buffer.start, buffer.size) == (400, 600)
    np.testing.assert_array_equal(buffer.peek(500, 700), samples[500:700])
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


def _voiced(seconds: float) -> np.ndarray:
    """A voiced, syllable-like burst: harmonics under a 4 Hz envelope."""
    t = np.arange(int(24000 * seconds)) / 24000
    return (
        0.3 * sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 12)) * (np.sin(2 * np.pi * 4 * t) > 0)
    )


def test_detector_events_do_not_depend_on_chunking():
    rng = np.random.default_rng(0)
    audio = np.concatenate([np.zeros(24000), _voiced(3), np.zeros(36000)]).astype(np.float32)
    whole = SpeechDetector(0.5, 300, 500).feed(audio)
    chunked, detector, i = [], SpeechDetector(0.5, 300, 500), 0
    while i < len(audio):
        n = int(rng.integers(480, 2401))
        chunked += detector.feed(audio[i : i + n])
        i += n
    assert [(e.kind, e.position) for e in chunked] == [(e.kind, e.position) for e in whole]
    assert [e.kind for e in whole] == ["started", "paused", "stopped"]  # the pause that lasted
    assert whole[1].position == whole[2].position
    # Speech starts in the window holding the burst's first sample, less the 300 ms prefix padding.
    assert whole[0].position >= 24000 - STEP - 7200 and whole[1].position % STEP == 0
    assert SpeechDetector(0.5, 300, 500).feed(np.zeros(48000, np.float32)) == []


def test_a_pause_reports_the_turn_end_it_would_have_and_speech_that_resumes_cancels_it():
    """Two spoken sentences (hibari) 0.2 s apart, then silence: the gap is a pause the speech resumes after;
    the last pause is the turn's end, at the same position the stop then reports, well before the silence
    wait is over, so the audio a session transcribes at the pause is exactly the turn's."""
    from omnistage.families.hibari.voice import load_hibari

    tts = load_hibari()
    spoken = [np.asarray(tts(text, seed=0), np.float32) for text in ("Open the door.", "Close the window.")]
    spoken = [s[: np.nonzero(np.abs(s) > 0.01)[0][-1] + 1] for s in spoken]  # without their trailing quiet
    gap, lead = np.zeros(int(24000 * 0.2), np.float32), np.zeros(12000, np.float32)
    audio = np.concatenate([lead, spoken[0], gap, spoken[1], np.zeros(36000, np.float32)])
    events = SpeechDetector(0.5, 300, 500).feed(audio)
    kinds = [e.kind for e in events]
    assert kinds[0] == "started" and kinds[-2:] == ["paused", "stopped"] and "resumed" in kinds, kinds
    assert all(kinds[i - 1] == "paused" for i, k in enumerate(kinds) if k == "resumed"), kinds
    assert events[-2].position == events[-1].position
    # Every spoken sample is in the turn, and no more than the end padding (and a window) of quiet after it.
    speech_end = len(audio) - 36000
    assert speech_end <= events[-1].position <= speech_end + STEP + END_PADDING_MS * 24
