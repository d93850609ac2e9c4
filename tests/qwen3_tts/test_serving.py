"""Qwen3-TTS served by `omnistage serve` with its default deploy (both stages as processes, async chunk):
/v1/audio/speech speaks the checkpoint's preset voices and answers 400 naming the field for bad ones."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.qwen3_tts.reference_outputs import tiny_dir
from tests.serving.server_process import ServerProcess

pytestmark = pytest.mark.engine

FRAME = 1920
GREEDY = [{"temperature": 0.0, "max_tokens": 20}, {}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = tiny_dir("custom_voice")
    log = tmp_path_factory.mktemp("qwen3-tts-server") / "server.log"
    proc = ServerProcess(["serve", str(model), "--num-threads", "1"], log, module="omnistage")
    try:
        proc.wait_healthy(timeout=300)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        yield client


def speech(http: httpx.Client, **fields) -> httpx.Response:
    name = tiny_dir("custom_voice").name
    body = {"model": name, "input": "Hello there, a test!", "response_format": "pcm", **fields}
    return http.post("/v1/audio/speech", json=body)


def test_speech_speaks_a_preset_voice(http: httpx.Client) -> None:
    got = speech(http, voice="vivian", language="English", stage_params=GREEDY)
    assert got.status_code == 200, got.text
    pcm = np.frombuffer(got.content, dtype="<i2")
    assert 0 < len(pcm) <= 20 * FRAME and len(pcm) % FRAME == 0  # whole 12.5 Hz frames, at most 20
    assert np.abs(pcm).max() > 1000  # not silence
    again = speech(http, voice="vivian", language="English", stage_params=GREEDY)
    assert again.content == got.content  # greedy: the same audio twice
    other = speech(http, voice="ryan", input="Speak slowly and clearly!", stage_params=GREEDY)
    assert other.status_code == 200 and other.content != got.content


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"voice": "nobody"}, "voice"),
        ({"voice": "vivian", "language": "Klingon"}, "language"),
    ],
)
def test_bad_fields_are_400_naming_them(http: httpx.Client, fields: dict, param: str) -> None:
    got = speech(http, **fields)
    assert got.status_code == 400, got.text
    assert param in got.text
