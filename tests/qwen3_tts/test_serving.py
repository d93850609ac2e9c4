"""Qwen3-TTS served by `omnistage serve` with its default deploy (both stages as processes, async chunk), a
CustomVoice and a Base checkpoint in one server: /v1/audio/speech (plain, SSE, raw stream), its batch and its
WebSocket speak the preset voices, the same audio by every route for the same greedy request; Base
clones a request's own clip (`ref_audio`, `ref_text`, `x_vector_only_mode`) exactly as the same clip uploaded;
`initial_codec_chunk_frames` sizes the first audio chunk; bad fields answer 400 naming them (a task the
checkpoint does not serve says which one it serves)."""

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
from tests.support.polling import wait_until
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.engine

FRAME = 1920
GREEDY = [{"temperature": 0.0, "max_tokens": 20}, {}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    models = [str(tiny_dir("custom_voice")), str(tiny_dir("base"))]
    log = tmp_path_factory.mktemp("qwen3-tts-server") / "server.log"
    voices = tmp_path_factory.mktemp("qwen3-tts-voices")
    args = ["serve", *models, "--num-threads", "1", "--voices-dir", str(voices)]
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


REF_TEXT = "A short clip to clone."


def clip_wav() -> bytes:
    """1.5 s of a voiced-like signal (harmonics under a syllable envelope) at 24 kHz, as WAV."""
    t = np.arange(36000) / 24000
    tone = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 6))
    wav = io.BytesIO()
    soundfile.write(
        wav, (0.2 * tone * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32), 24000, format="WAV"
    )
    return wav.getvalue()


def base_speech(http: httpx.Client, **fields) -> httpx.Response:
    body = {"model": tiny_dir("base").name, "input": "Hello there, a test!", "response_format": "pcm"}
    return http.post("/v1/audio/speech", json={**body, "stage_params": GREEDY, **fields})


def upload(http: httpx.Client, name: str, wav: bytes, ref_text: str | None = None) -> None:
    data = {"name": name, "consent": "yes", **({"ref_text": ref_text} if ref_text else {})}
    got = http.post("/v1/audio/voices", data=data, files={"audio_sample": (f"{name}.wav", wav, "audio/wav")})
    assert got.status_code == 200, got.text


def test_ref_audio_clones_as_the_same_clip_uploaded(http: httpx.Client) -> None:
    wav = clip_wav()
    upload(http, "clip-icl", wav, REF_TEXT)
    upload(http, "clip-xvec", wav)
    inline = "data:audio/wav;base64," + base64.b64encode(wav).decode()
    icl = base_speech(http, ref_audio=inline, ref_text=REF_TEXT)
    assert icl.status_code == 200, icl.text
    uploaded = base_speech(http, voice="clip-icl")
    assert uploaded.status_code == 200, uploaded.text
    assert icl.content == uploaded.content  # in context: the clip's codes and transcript in the prompt
    assert icl.content == base_speech(http, ref_audio=inline, ref_text=REF_TEXT, task_type="Base").content
    audio_tokens = int(icl.headers["x-omnistage-input-audio-tokens"])  # the clip's frames, 1.5 s at 12.5 Hz
    assert audio_tokens in (18, 19) and audio_tokens == int(
        uploaded.headers["x-omnistage-input-audio-tokens"]
    )
    xvec = base_speech(http, ref_audio=inline, ref_text=REF_TEXT, x_vector_only_mode=True)
    assert xvec.status_code == 200, xvec.text
    assert xvec.content == base_speech(http, voice="clip-xvec").content != icl.content  # the embedding only
    assert int(xvec.headers["x-omnistage-input-audio-tokens"]) == 0


def test_initial_codec_chunk_frames_sizes_the_first_audio_chunk(http: httpx.Client) -> None:
    long = [{"temperature": 0.0, "max_tokens": 20, "min_tokens": 12}, {}]  # more frames than a first chunk
    fields = {"voice": "vivian", "stage_params": long, "stream": True}
    for frames in (3, 5):
        body = {"model": model_name(), "input": "Hello there, a test!", "response_format": "pcm", **fields}
        deltas = []
        with http.stream(
            "POST", "/v1/audio/speech", json={**body, "initial_codec_chunk_frames": frames}
        ) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                data = json.loads(line[5:]) if line.startswith("data:") else {}
                if data.get("type") == "speech.audio.delta":
                    deltas.append(base64.b64decode(data["audio"]))
        assert len(deltas[0]) == frames * FRAME * 2  # PCM16: 2 bytes a sample
        whole = speech(http, voice="vivian", stage_params=long).content
        assert len(deltas) >= 2 and len(b"".join(deltas)) == len(whole) >= 12 * FRAME * 2


@pytest.mark.parametrize(
    ("checkpoint", "fields", "param", "text"),
    [
        ("custom_voice", {"voice": "vivian", "task_type": "Base"}, "task_type", "serves CustomVoice"),
        ("custom_voice", {"voice": "vivian", "task_type": "Other"}, "task_type", ""),
        ("custom_voice", {"ref_audio": "data:audio/wav;base64,AAAA"}, "ref_audio", "serves CustomVoice"),
        ("base", {"ref_text": REF_TEXT}, "ref_text", "needs a voice to clone"),
        ("base", {"x_vector_only_mode": True}, "x_vector_only_mode", "needs a voice to clone"),
        ("base", {"ref_audio": "data:audio/wav;base64,AAAA"}, "ref_audio", "not a readable audio clip"),
        ("base", {"ref_audio": "data:audio/wav;base64,@@"}, "ref_audio", "base64"),
        ("base", {"ref_audio": "/etc/hostname"}, "ref_audio", "--allowed-local-media-path"),
        ("base", {"ref_audio": "ftp://x/a.wav"}, "ref_audio", "unsupported"),
        ("base", {"initial_codec_chunk_frames": -1}, "initial_codec_chunk_frames", ""),
    ],
)
def test_bad_clone_and_task_fields_are_400_naming_them(http, checkpoint, fields, param, text) -> None:
    body = {"model": tiny_dir(checkpoint).name, "input": "Hello there!", "response_format": "pcm", **fields}
    got = http.post("/v1/audio/speech", json=body)
    assert got.status_code == 400, got.text
    error = got.json()["error"]
    assert error["param"] == param and text in error["message"], error


def test_disconnect_mid_stream_frees_both_stages(http: httpx.Client, server) -> None:
    """A client that leaves while the codec streams and the talker still generates: the request is aborted
    in both stages (the server's abort count), neither holds it afterwards, and the server serves on."""
    from tests.speech.stages import aborted, metric, wait_idle

    model = model_name()
    # 4000 frames: minutes of work for the talker (400 took 18 s on a 2-core EPYC), far beyond wait_idle's
    # bound, so the stages going idle within it means the abort reached them
    endless = [{"temperature": 0.0, "max_tokens": 4000, "min_tokens": 4000}, {}]
    body = {"model": model, "input": "Hello there, a test!", "response_format": "pcm", "voice": "vivian"}
    body |= {"stage_params": endless, "stream": True, "initial_codec_chunk_frames": 2}

    def held(stage_name: str) -> float:
        return metric(http, "omnistage_stage_requests", model=model, stage_name=stage_name)

    before = aborted(http, model)
    with (
        httpx.Client(base_url=server.url, timeout=120) as own,
        own.stream("POST", "/v1/audio/speech", json=body) as reply,
    ):
        lines = reply.iter_lines()  # kept alive: dropping the iterator closes the connection
        assert any('"speech.audio.delta"' in line for line in lines)  # the codec has spoken
        wait_until(lambda: held("talker") == 1 and held("codec") == 1, 120, "both stages holding it")
    wait_idle(http, model)
    assert aborted(http, model) == before + 1
    assert speech(http, voice="vivian", stage_params=GREEDY).status_code == 200
