"""The speech tests' server: the session's voice demo server (tests/support/voice_demo.py), which serves the
voice (`hibari-en`) and the chat model that speaks its answers (`smollm2-135m-instruct`: SmolLM2 → the voice)
among others. `speech_server_args` starts a server of just those two (the restart tests' own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.support.server_process import ServerProcess

VOICE_MODEL = "hibari-en"
CHAT_MODEL = "smollm2-135m-instruct"


def speech_server_args(voices_dir: Path) -> list[str]:
    from omnistage.demo.smollm import smollm2_dir
    from omnistage.demo.voice import spoken_chat_dir, voice_dir

    models = [str(voice_dir()), str(spoken_chat_dir(smollm2_dir()))]
    return ["serve", *models, "--num-threads", "1", "--voices-dir", str(voices_dir)]


@pytest.fixture(scope="session")
def speech_server(voice_demo_server: ServerProcess) -> ServerProcess:
    return voice_demo_server


@pytest.fixture(scope="session")
def speech_client(speech_server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=speech_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def speech_http(speech_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=speech_server.url, timeout=300) as client:
        yield client
