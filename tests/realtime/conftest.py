"""Realtime sessions run against the session's voice demo server (tests/support/voice_demo.py): the tiny
Qwen2.5-Omni (it hears audio and answers in text and speech) and the demo's voice loop (Whisper tiny.en
transcribes, SmolLM2 answers, the hibari voice speaks; the voice also speaks the questions), with a small
session bound, input limit and idle timeout so the limits can be reached."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
from openai import OpenAI

from tests.support.server_process import ServerProcess
from tests.support.voice_demo import CHAT, IDLE_S, MAX_AUDIO_S, MAX_SESSIONS, OMNI, VOICE, WHISPER

__all__ = ["CHAT", "IDLE_S", "MAX_AUDIO_S", "MAX_SESSIONS", "OMNI", "VOICE", "WHISPER"]
RATE = 24000
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="session")
def realtime_server(voice_demo_server: ServerProcess) -> ServerProcess:
    return voice_demo_server


@pytest.fixture(scope="session")
def realtime_client(realtime_server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=realtime_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def http(realtime_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=realtime_server.url, timeout=300) as client:
        yield client


@pytest.fixture(scope="session")
def question(http: httpx.Client) -> np.ndarray:
    """The hibari voice asking QUESTION: int16 samples at 24 kHz."""
    body = {"model": VOICE, "input": QUESTION, "response_format": "wav", "seed": 0}
    response = http.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    samples, rate = sf.read(io.BytesIO(response.content), dtype="int16")
    assert rate == RATE
    return samples


def wav_bytes(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


def spoken_turn(speech: np.ndarray, lead_s: float = 0.5, tail_s: float = 1.2) -> np.ndarray:
    """Silence, the speech, silence (for the VAD to hear it end)."""
    silence = np.zeros(int(lead_s * RATE), np.int16), np.zeros(int(tail_s * RATE), np.int16)
    return np.concatenate([silence[0], speech, silence[1]])


def chunks(samples: np.ndarray, seed: int = 0) -> Iterator[str]:
    """base64 pcm16 chunks of 20-100 ms, as a live client sends them."""
    rng = np.random.default_rng(seed)
    i = 0
    while i < len(samples):
        n = int(rng.integers(20, 101)) * RATE // 1000
        yield base64.b64encode(samples[i : i + n].astype("<i2").tobytes()).decode()
        i += n


def recv_until(conn: Any, kind: str, seen: list[Any] | None = None, limit: int = 100_000) -> Any:
    """Events until (and with) the first of type `kind`; every event lands in `seen`."""
    for _ in range(limit):
        event = conn.recv()
        if seen is not None:
            seen.append(event)
        if event.type == kind:
            return event
    raise AssertionError(f"no {kind} within {limit} events")
