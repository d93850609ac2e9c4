"""Qwen3-TTS served by `omnistage serve` with its default deploy (both stages as processes, async chunk):
/v1/audio/speech (plain, SSE, raw stream), its batch and its WebSocket speak the checkpoint's preset voices,
the same audio by every route for the same greedy request; bad fields answer 400 naming them (an uploaded
voice on this CustomVoice checkpoint says which task it serves)."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import soundfile
from websockets.sync.client import connect

from tests.qwen3_tts.reference_outputs import tiny_dir
from tests.serving.server_process import ServerProcess

pytestmark = pytest.mark.engine

FRAME = 1920
GREEDY = [{"temperature": 0.0, "max_tokens": 20}, {}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    model = tiny_dir("custom_voice")
    log = tmp_path_factory.mktemp("qwen3-tts-server") / "server.log"
    voices = tmp_path_factory.mktemp("qwen3-tts-voices")
    args = ["serve", str(model), "--num-threads", "1", "--voices-dir", str(voices)]
    proc = ServerProcess(args, log, module="omnistage")
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


def model_name() -> str:
    return tiny_dir("custom_voice").name


def test_sse_raw_stream_batch_and_websocket_speak_the_same_audio(http: httpx.Client, server) -> None:
    fields = {"voice": "vivian", "language": "English", "stage_params": GREEDY}
    whole = speech(http, **fields)
    assert whole.status_code == 200 and len(whole.content) > 0
    assert int(whole.headers["x-omnistage-input-audio-tokens"]) == 0

    body = {"model": model_name(), "input": "Hello there, a test!", "response_format": "pcm", **fields}
    deltas, done = [], None
    with http.stream("POST", "/v1/audio/speech", json={**body, "stream": True}) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("data:"):
                data = json.loads(line[5:])
                if data["type"] == "speech.audio.delta":
                    deltas.append(base64.b64decode(data["audio"]))
                else:
                    done = data
    assert done is not None and done["type"] == "speech.audio.done", done
    assert done["usage"]["input_token_details"]["audio_tokens"] == 0
    assert len(deltas) >= 2 and b"".join(deltas) == whole.content  # async chunk: several pieces, same audio

    with http.stream("POST", "/v1/audio/speech", json={**body, "stream_format": "audio"}) as reply:
        assert reply.status_code == 200
        raw = b"".join(reply.iter_bytes())
    assert raw == whole.content

    items = [{"input": "Hello there, a test!"}, {"input": "  "}, {"input": "Hi", "voice": "nobody"}]
    batch = http.post("/v1/audio/speech/batch", json={"model": model_name(), **fields, "items": items,
                                                       "response_format": "pcm"})  # fmt: skip
    assert batch.status_code == 200, batch.text
    results = batch.json()["results"]
    assert [r["status"] for r in results] == ["success", "error", "error"]
    assert base64.b64decode(results[0]["audio_data"]) == whole.content
    assert results[1]["param"] == "input" and results[2]["param"] == "voice"

    with connect(server.url.replace("http", "ws") + "/v1/audio/speech/stream", max_size=None) as ws:
        config = {"type": "session.config", "model": model_name(), "response_format": "pcm", **fields}
        ws.send(json.dumps(config))
        ws.send(json.dumps({"type": "input.text", "text": "Hello there, a test!"}))
        ws.send(json.dumps({"type": "input.done"}))
        start = json.loads(ws.recv(timeout=120))
        assert start["type"] == "audio.start" and start["sample_rate"] == 24000
        chunks = []
        while isinstance(message := ws.recv(timeout=120), bytes):
            chunks.append(message)
        assert json.loads(message)["type"] == "audio.done"
        assert json.loads(ws.recv(timeout=120))["type"] == "session.done"
    assert b"".join(chunks) == whole.content


def test_bad_inputs_are_400_naming_the_field(http: httpx.Client) -> None:
    for fields, param in [({"input": "   ", "voice": "vivian"}, "input"), ({}, "voice")]:
        got = speech(http, **fields)
        assert got.status_code == 400 and got.json()["error"]["param"] == param, got.text
    too_many = speech(http, voice="vivian", max_new_tokens=0)
    assert too_many.status_code in (400, 422) and "max_new_tokens" in too_many.text
    wav = io.BytesIO()
    soundfile.write(wav, np.zeros(12000, dtype=np.float32) + 0.1, 24000, format="WAV")
    upload = http.post(
        "/v1/audio/voices",
        data={"name": "mine", "consent": "yes"},
        files={"audio_sample": ("mine.wav", wav.getvalue(), "audio/wav")},
    )
    assert upload.status_code == 200, upload.text
    cloned = speech(http, voice="mine")
    assert cloned.status_code == 400 and cloned.json()["error"]["param"] == "voice"
    assert "CustomVoice" in cloned.text  # the task this checkpoint serves
