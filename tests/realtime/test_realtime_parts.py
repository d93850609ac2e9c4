"""The session's parts on their own: the pcm16 buffer's positions across takes, peeks and clears, the silero
detector's independence from how the audio was chunked, and an early turn's held events."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest

from omnistage.serving.realtime.audio import AudioBuffer, decode_pcm16
from omnistage.serving.realtime.events import BadEvent
from omnistage.serving.realtime.turn import HeldSend
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
    # The burst's gaps outlast the tail, not the silence: the first quiet is withdrawn by speech resuming;
    # the stop ends the segment where its quiet said, one tail after the first quiet sample.
    assert [e.kind for e in whole] == ["started", "quiet", "resumed", "quiet", "stopped"]
    quiet, resumed, last_quiet, stopped = (e.position for e in whole[1:])
    assert quiet <= resumed < last_quiet == stopped and stopped % STEP == 0
    # Speech starts in the window holding the burst's first sample, less the 300 ms prefix padding.
    assert whole[0].position >= 24000 - STEP - 7200
    assert SpeechDetector(0.5, 300, 500).feed(np.zeros(48000, np.float32)) == []


def test_held_events_are_sent_in_order_on_release_or_never():
    sent = []

    async def send(kind, **fields):
        sent.append((kind, fields))

    async def main():
        held = HeldSend(send)
        await held("a", n=1)
        await held("b", n=2)
        assert sent == []
        await held.release()
        await held("c", n=3)
        dropped = HeldSend(send)
        await dropped("x")
        dropped.drop()
        await dropped("y")

    asyncio.run(main())
    assert sent == [("a", {"n": 1}), ("b", {"n": 2}), ("c", {"n": 3})]


def test_peek_leaves_the_samples_in_the_buffer():
    buffer = AudioBuffer(max_seconds=1.0)
    samples = np.arange(1000, dtype=np.float32)
    buffer.append(samples)
    buffer.take(0, 100)
    np.testing.assert_array_equal(buffer.peek(200, 500), samples[200:500])
    assert (buffer.start, buffer.size) == (100, 900)
    np.testing.assert_array_equal(buffer.take(200, 500), samples[200:500])
