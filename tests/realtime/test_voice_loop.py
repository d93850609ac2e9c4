"""The demo's voice loop over WS /v1/realtime with the official `openai` client: a question the hibari voice
spoke, streamed in 20-100 ms chunks, is transcribed by Whisper, answered by SmolLM2 and spoken by the voice.
Each part is checked against the same model asked over its own HTTP route."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from openai import OpenAI

from tests.asr import wer
from tests.realtime.conftest import CHAT, RATE, WHISPER, chunks, recv_until, spoken_turn, voiced, wav_bytes
from tests.speech.stages import metric, wait_idle

pytestmark = pytest.mark.e2e
ANSWER_TOKENS = 24
SILENCE_MS = 800
PAUSE_S = 0.4  # past the VAD's tail (vad.TAIL_MS), under SILENCE_MS


def whisper(client: OpenAI, samples: np.ndarray) -> str:
    return client.audio.transcriptions.create(model=WHISPER, file=("turn.wav", wav_bytes(samples))).text


def test_spoken_question_is_transcribed_answered_and_spoken(realtime_client: OpenAI, http, question):
    turn = spoken_turn(question)
    seen = []
    with realtime_client.realtime.connect(model=CHAT) as conn:
        session = {"type": "realtime", "temperature": 0.0, "max_output_tokens": ANSWER_TOKENS}
        conn.session.update(session=session)
        for audio in chunks(turn, seed=2):
            conn.input_audio_buffer.append(audio=audio)
        done = recv_until(conn, "response.done", seen)
    assert done.response.status == "completed"
    heard = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
    committed = next(e for e in seen if e.type == "input_audio_buffer.committed")
    started = next(e for e in seen if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in seen if e.type == "input_audio_buffer.speech_stopped")
    assert heard.item_id == committed.item_id
    segment = turn[started.audio_start_ms * RATE // 1000 : stopped.audio_end_ms * RATE // 1000]
    # The transcript is Whisper's, of the committed audio and of the spoken question as a whole.
    assert heard.transcript == whisper(realtime_client, segment) == whisper(realtime_client, question)
    assert heard.transcript
    # The answer is the chat model's greedy answer to that transcript.
    answer = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
    chat = realtime_client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": heard.transcript}],
        temperature=0,
        max_tokens=ANSWER_TOKENS,
    )
    assert answer and answer == chat.choices[0].message.content
    # Its audio says it.
    pcm = b"".join(base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta")
    spoken = np.frombuffer(pcm, "<i2")
    assert wer(answer, whisper(realtime_client, spoken)) <= 0.3
    wait_idle(http, CHAT)


def test_speech_resuming_after_a_short_pause_is_one_turn(realtime_client: OpenAI, http, question):
    """The pause outlasts the VAD's tail, so work starts on the first half, but not the silence: that early
    turn is withdrawn unseen (its requests aborted) and the whole utterance is one turn."""
    pause = np.zeros(int(PAUSE_S * RATE), np.int16)
    speech = voiced(question)
    turn = spoken_turn(np.concatenate([speech, pause, speech]))
    transcribed = metric(http, "omnistage_requests_finished_total", model=WHISPER)
    seen = []
    with realtime_client.realtime.connect(model=CHAT) as conn:
        detection = {"type": "server_vad", "silence_duration_ms": SILENCE_MS}
        session = {"type": "realtime", "temperature": 0.0, "max_output_tokens": 4}
        conn.session.update(session={**session, "audio": {"input": {"turn_detection": detection}}})
        for audio in chunks(turn, seed=3):
            conn.input_audio_buffer.append(audio=audio)
        done = recv_until(conn, "response.done", seen)
    kinds = [e.type for e in seen]
    assert done.response.status == "completed", kinds
    once = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
    ]
    assert [kinds.count(k) for k in once] == [1] * len(once), kinds
    # Two transcriptions ran: the withdrawn one of the first half, and the turn's.
    assert metric(http, "omnistage_requests_finished_total", model=WHISPER) - transcribed == 2
    started = next(e for e in seen if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in seen if e.type == "input_audio_buffer.speech_stopped")
    segment = turn[started.audio_start_ms * RATE // 1000 : stopped.audio_end_ms * RATE // 1000]
    assert len(segment) > len(speech) + len(pause)  # both halves
    heard = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
    assert heard.transcript == whisper(realtime_client, segment)
    wait_idle(http, CHAT)
    wait_idle(http, WHISPER)
