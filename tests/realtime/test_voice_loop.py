"""The demo's voice loop over WS /v1/realtime with the official `openai` client: a question the hibari voice
spoke, streamed in 20-100 ms chunks, is transcribed by Whisper, answered by SmolLM2 and spoken by the voice.
Each part is checked against the same model asked over its own HTTP route."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from openai import OpenAI

from tests.realtime.conftest import CHAT, RATE, WHISPER, chunks, recv_until, spoken_turn, wav_bytes
from tests.speech.stages import wait_idle
from tests.support.asr import wer

pytestmark = pytest.mark.e2e
ANSWER_TOKENS = 24


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


def test_a_pause_inside_the_turn_drops_its_early_transcript_and_the_turn_is_heard_whole(
    realtime_client: OpenAI, http, question
):
    """The question twice, 0.25 s apart (a pause the VAD reports, shorter than the 0.6 s silence wait): the
    transcript started at the pause is dropped when the speech resumes (its request aborted in Whisper's
    stages), and the turn's transcript is Whisper's of the whole committed turn."""
    voiced = np.nonzero(np.abs(question) > 0.01 * np.abs(question).max())[0]
    spoken = question[: voiced[-1] + 1]  # without the clip's own trailing quiet
    turn = spoken_turn(np.concatenate([spoken, np.zeros(RATE // 4, np.int16), spoken]))
    seen = []
    with realtime_client.realtime.connect(model=CHAT) as conn:
        turn_detection = {"type": "server_vad", "silence_duration_ms": 600}
        conn.session.update(
            session={
                "type": "realtime",
                "temperature": 0.0,
                "max_output_tokens": 4,
                "audio": {"input": {"turn_detection": turn_detection}},
            }
        )
        for audio in chunks(turn, seed=3):
            conn.input_audio_buffer.append(audio=audio)
        done = recv_until(conn, "response.done", seen)
    assert done.response.status == "completed"
    assert [e.type for e in seen].count("input_audio_buffer.committed") == 1
    heard = next(e for e in seen if e.type == "conversation.item.input_audio_transcription.completed")
    started = next(e for e in seen if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in seen if e.type == "input_audio_buffer.speech_stopped")
    assert stopped.audio_end_ms > 1000 * (RATE // 2 + 2 * len(spoken)) / RATE  # both questions are in it
    segment = turn[started.audio_start_ms * RATE // 1000 : stopped.audio_end_ms * RATE // 1000]
    assert heard.transcript == whisper(realtime_client, segment)
    assert len(heard.transcript.split()) > len(whisper(realtime_client, spoken).split())
    wait_idle(http, WHISPER)
    wait_idle(http, CHAT)
