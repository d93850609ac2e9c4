"""WS /v1/realtime on the tiny Qwen2.5-Omni through the official `openai` client's realtime API: server VAD
turns, the answer equal to the same audio asked over chat, cancel and barge-in aborting every stage, bad input
answered with `error` events, the session bound and the idle timeout."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from openai import OpenAI

from tests.realtime.conftest import (
    IDLE_S,
    MAX_AUDIO_S,
    MAX_SESSIONS,
    OMNI,
    RATE,
    chunks,
    recv_until,
    spoken_turn,
    wav_bytes,
)
from tests.speech.stages import wait_idle

pytestmark = pytest.mark.e2e
THINKER_TOKENS = 8
SHORT = [None, {"max_tokens": 24}, None]  # a short spoken answer: the talker's codes
LONG = [None, {"max_tokens": 2000, "ignore_eos": True}, None]  # speaks until cancelled


def greedy_session(stage_params: list, turn_detection: dict | None = None) -> dict:
    turn = {"type": "server_vad", "silence_duration_ms": 400} if turn_detection is None else turn_detection
    return {
        "type": "realtime",
        "temperature": 0.0,
        "max_output_tokens": THINKER_TOKENS,
        "stage_params": stage_params,
        "audio": {"input": {"turn_detection": turn or None}},
    }


def chat_answer(http, samples: np.ndarray) -> str:
    """The thinker's greedy answer to `samples` over /v1/chat/completions."""
    data = base64.b64encode(wav_bytes(samples)).decode()
    part = {"type": "input_audio", "input_audio": {"data": data, "format": "wav"}}
    body = {
        "model": OMNI,
        "messages": [{"role": "user", "content": [part]}],
        "temperature": 0,
        "max_tokens": THINKER_TOKENS,
        "modalities": ["text"],
    }
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_server_vad_turn_answers_as_chat_does(realtime_client: OpenAI, http, question):
    turn = spoken_turn(question)
    seen = []
    with realtime_client.realtime.connect(model=OMNI) as conn:
        assert conn.recv().type == "session.created"
        conn.session.update(session=greedy_session(SHORT))
        assert recv_until(conn, "session.updated").session.audio.input.turn_detection.type == "server_vad"
        for audio in chunks(turn):
            conn.input_audio_buffer.append(audio=audio)
        done = recv_until(conn, "response.done", seen)
    kinds = [e.type for e in seen]
    order = [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "response.created",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.done",
    ]
    assert [kinds.index(k) for k in order] == sorted(kinds.index(k) for k in order), kinds
    started = next(e for e in seen if e.type == "input_audio_buffer.speech_started")
    stopped = next(e for e in seen if e.type == "input_audio_buffer.speech_stopped")
    committed = next(e for e in seen if e.type == "input_audio_buffer.committed")
    assert started.item_id == stopped.item_id == committed.item_id
    # The speech starts after the 0.5 s lead (less the 300 ms prefix padding); the turn holds all of it, and
    # ends before the silence wait is over.
    voiced_end_ms = 1000 * np.nonzero(np.abs(turn) > 0.01 * np.abs(turn).max())[0][-1] / RATE
    assert 200 <= started.audio_start_ms < voiced_end_ms <= stopped.audio_end_ms < voiced_end_ms + 400
    assert done.response.status == "completed"
    transcript = "".join(e.delta for e in seen if e.type == "response.output_audio_transcript.delta")
    assert transcript and done.response.output[0].content[0].transcript == transcript
    audio = b"".join(base64.b64decode(e.delta) for e in seen if e.type == "response.output_audio.delta")
    assert len(audio) > 0 and len(audio) % 2 == 0
    # The committed item is the turn between the VAD's times; asked over chat it gets the same answer.
    segment = turn[started.audio_start_ms * RATE // 1000 : stopped.audio_end_ms * RATE // 1000]
    assert transcript == chat_answer(http, segment)


def test_response_cancel_stops_every_stage(realtime_client: OpenAI, http, question):
    seen = []
    with realtime_client.realtime.connect(model=OMNI) as conn:
        conn.session.update(session=greedy_session(LONG, turn_detection={}))
        recv_until(conn, "session.updated")
        for audio in chunks(question):
            conn.input_audio_buffer.append(audio=audio)
        conn.input_audio_buffer.commit()
        committed = recv_until(conn, "input_audio_buffer.committed", seen)
        conn.response.create()
        created = recv_until(conn, "response.created", seen)
        recv_until(conn, "response.output_audio.delta", seen)
        conn.response.cancel()
        done = recv_until(conn, "response.done", seen)
        assert done.response.id == created.response.id and done.response.status == "cancelled"
        assert done.response.status_details.reason == "client_cancelled"
        wait_idle(http, OMNI)
        # The session goes on: a second response to the same conversation.
        conn.session.update(session={"stage_params": SHORT})
        conn.response.create()
        again = recv_until(conn, "response.done", seen)
        assert again.response.status == "completed" and committed.item_id


def test_barge_in_cancels_the_playing_response_and_clears_its_audio(realtime_client: OpenAI, http, question):
    turn = spoken_turn(question)
    seen = []
    with realtime_client.realtime.connect(model=OMNI) as conn:
        conn.session.update(session=greedy_session(LONG))
        for audio in chunks(turn):
            conn.input_audio_buffer.append(audio=audio)
        created = recv_until(conn, "response.created", seen)
        recv_until(conn, "response.output_audio.delta", seen)
        for audio in chunks(turn, seed=1):  # the user speaks again over the answer
            conn.input_audio_buffer.append(audio=audio)
        cleared = recv_until(conn, "output_audio_buffer.cleared", seen)
        assert cleared.response_id == created.response.id
        second = recv_until(conn, "response.created", seen)
        conn.response.cancel()
        recv_until(conn, "response.done", seen)
    first_done = next(e for e in seen if e.type == "response.done" and e.response.id == created.response.id)
    assert (
        first_done.response.status == "cancelled"
        and first_done.response.status_details.reason == "turn_detected"
    )
    barge = next(
        i
        for i, e in enumerate(seen)
        if e.type == "input_audio_buffer.speech_started" and i > seen.index(created)
    )
    later = [
        e
        for e in seen[barge:]
        if e.type == "response.output_audio.delta" and e.response_id == created.response.id
    ]
    assert later == [] and second.response.id != created.response.id
    wait_idle(http, OMNI)


def test_bad_events_get_errors_and_the_session_survives(realtime_client: OpenAI):
    with realtime_client.realtime.connect(model=OMNI) as conn:
        conn.recv()
        too_long = base64.b64encode(np.zeros((MAX_AUDIO_S + 1) * RATE, "<i2").tobytes()).decode()
        bad = [
            ({"type": "no.such.event", "event_id": "e1"}, "type", "invalid_event"),
            ({"type": "input_audio_buffer.append", "audio": "%%not base64%%"}, "audio", "invalid_base64"),
            (
                {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"abc").decode()},
                "audio",
                "invalid_audio_format",
            ),
            (
                {
                    "type": "session.update",
                    "session": {"audio": {"input": {"format": {"type": "audio/pcmu"}}}},
                },
                "session.audio.input.format.type",
                "invalid_value",
            ),
            (
                {"type": "session.update", "session": {"audio": {"input": {"format": {"rate": 16000}}}}},
                "session.audio.input.format.rate",
                "invalid_value",
            ),
            (
                {"type": "input_audio_buffer.append", "audio": too_long},
                "audio",
                "input_audio_buffer_too_large",
            ),
            ({"type": "input_audio_buffer.commit"}, None, "input_audio_buffer_commit_empty"),
            ({"type": "response.cancel"}, None, "response_cancel_not_active"),
        ]
        for event, param, code in bad:
            conn.send(event)
            error = recv_until(conn, "error").error
            assert (error.param, error.code) == (param, code), (event["type"], error)
        assert error.message
        conn.input_audio_buffer.append(audio=base64.b64encode(np.zeros(RATE // 10, "<i2").tobytes()).decode())
        conn.input_audio_buffer.clear()
        assert recv_until(conn, "input_audio_buffer.cleared").type == "input_audio_buffer.cleared"
        conn.session.update(session={"instructions": "Be brief."})
        assert recv_until(conn, "session.updated").session.instructions == "Be brief."


def test_sessions_over_the_bound_are_refused_and_idle_ones_closed(realtime_client: OpenAI):
    conns = [realtime_client.realtime.connect(model=OMNI).enter() for _ in range(MAX_SESSIONS)]
    try:
        for conn in conns:
            assert conn.recv().type == "session.created"
        with realtime_client.realtime.connect(model=OMNI) as extra:
            error = extra.recv()
            assert error.type == "error" and error.error.code == "session_limit_reached"
            assert f"{MAX_SESSIONS} realtime sessions" in error.error.message
        # Sent nothing for IDLE_S seconds with nothing being answered: the server says so and closes.
        idle = conns[0].recv()
        assert (
            idle.type == "error"
            and idle.error.code == "session_idle_timeout"
            and str(IDLE_S) in idle.error.message
        )
    finally:
        for conn in conns:
            conn.close()
