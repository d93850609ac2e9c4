"""Dia served by `omnistage serve` with its default deploy (both stages as processes, async chunk), through
the official `openai` client where it has the call: speech, its SSE and raw streams equal to the whole, the
batch and the streaming-text WebSocket speaking the same audio; a voice uploaded with its transcript is
continued as the same clip given inline, and still is after a restart; bad fields answer 400 naming them; a
client that leaves mid-stream frees both stages."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import soundfile
from openai import OpenAI
from websockets.sync.client import connect

from omnistage.families.dia.tiny import tiny_dia_dir
from tests.dia.reference import clip
from tests.support import speech_family
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.engine

GREEDY = [{"temperature": 0.0, "max_tokens": 40}, {}]
TEXT = "[S1] The quick brown fox jumps over the lazy dog."  # ends at the 40-frame limit (tests/dia)
REF_TEXT = "[S1] Once upon a time."


def start(voices: Path, log: Path) -> ServerProcess:
    return speech_family.start(tiny_dia_dir(), voices, log)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return tmp_path_factory.mktemp("dia-voices"), tmp_path_factory.mktemp("dia-server")


@pytest.fixture(scope="module")
def server(dirs) -> Iterator[ServerProcess]:
    proc = start(dirs[0], dirs[1] / "server.log")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def model() -> str:
    return tiny_dia_dir().name


def speak(client: OpenAI, text: str = TEXT, **extra) -> bytes:
    voice = extra.pop("voice", "default")
    reply = client.audio.speech.create(
        model=model(),
        voice=voice,
        input=text,
        response_format="pcm",
        extra_body={"stage_params": GREEDY, **extra},
    )
    return reply.content


def wav(samples) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, 44100, format="WAV", subtype="FLOAT")
    return out.getvalue()


def test_every_route_speaks_the_same_audio(client: OpenAI, http: httpx.Client, server) -> None:
    whole = speak(client)
    assert len(whole) > 0 and speak(client, text="[S2] Something else entirely.") != whole

    deltas, done = [], None
    stream = client.audio.speech.with_streaming_response
    with stream.create(model=model(), voice="default", input=TEXT, response_format="pcm",
                       extra_body={"stage_params": GREEDY, "stream": True}) as reply:  # fmt: skip
        for line in reply.iter_lines():
            if line.startswith("data:"):
                data = json.loads(line[5:])
                if data["type"] == "speech.audio.delta":
                    deltas.append(base64.b64decode(data["audio"]))
                else:
                    done = data
    assert done is not None and done["type"] == "speech.audio.done", done
    assert len(deltas) >= 2 and b"".join(deltas) == whole  # async chunks, joined: the same audio

    with stream.create(model=model(), voice="default", input=TEXT, response_format="pcm",
                       extra_body={"stage_params": GREEDY, "stream_format": "audio"}) as reply:  # fmt: skip
        assert b"".join(reply.iter_bytes()) == whole

    fields = {"voice": "default", "stage_params": GREEDY, "response_format": "pcm"}
    items = [{"input": TEXT}, {"input": "  "}, {"input": TEXT, "ref_text": REF_TEXT}]
    batch = http.post("/v1/audio/speech/batch", json={"model": model(), **fields, "items": items})
    assert batch.status_code == 200, batch.text
    results = batch.json()["results"]
    assert [r["status"] for r in results] == ["success", "error", "error"]
    assert base64.b64decode(results[0]["audio_data"]) == whole
    assert results[1]["param"] == "input" and results[2]["param"] == "ref_text"

    with connect(server.url.replace("http", "ws") + "/v1/audio/speech/stream", max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "model": model(), **fields}))
        ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
        start_event = json.loads(ws.recv(timeout=120))
        assert start_event["type"] == "audio.start" and start_event["sample_rate"] == 44100
        chunks = []
        while isinstance(message := ws.recv(timeout=120), bytes):
            chunks.append(message)
        assert json.loads(message)["type"] == "audio.done"
    assert b"".join(chunks) == whole


def test_an_uploaded_voice_is_continued_as_its_clip(client: OpenAI, http: httpx.Client) -> None:
    sample = clip(0.3, 180.0)
    got = http.post(
        "/v1/audio/voices",
        data={"name": "teller", "consent": "yes", "ref_text": REF_TEXT},
        files={"audio_sample": ("teller.wav", wav(sample), "audio/wav")},
    )
    assert got.status_code == 200, got.text
    uploaded = speak(client, voice="teller")
    inline = speak(client, ref_audio="data:audio/wav;base64," + base64.b64encode(wav(sample)).decode(),
                   ref_text=REF_TEXT)  # fmt: skip
    assert uploaded == inline != speak(client)
    entry = http.get("/v1/audio/voices", params={"model": model()}).json()["models"][0]
    assert entry["voices"] == ["default"] and entry["clones_voices"] is True


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"voice": "nobody"}, "voice"),
        ({"ref_text": REF_TEXT}, "ref_text"),
        ({"ref_audio": "data:audio/wav;base64,AAAA", "ref_text": REF_TEXT}, "ref_audio"),
        ({"ref_audio": "/etc/hostname", "ref_text": REF_TEXT}, "ref_audio"),
        ({"instructions": "Speak warmly"}, "instructions"),
        ({"speaker_id": 1}, "speaker_id"),
        ({"guidance_scale": 0.5}, "guidance_scale"),
        ({"guidance_scale": "strong"}, "guidance_scale"),
    ],
)
def test_bad_fields_are_400_naming_them(client: OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        speak(client, **extra)
    assert refused.value.status_code == 400 and speech_family.refused_param(refused.value) == param


def test_guidance_scale_reaches_the_decoder(client: OpenAI) -> None:
    """`guidance_scale` 1 turns classifier-free guidance off: other frames than the checkpoint's 3.0 (with a
    guidance top-k small enough to decide frames on the tiny vocabulary, tests/dia/reference.py)."""
    params = [{**GREEDY[0], "top_k": 2}, {}]
    guided = speak(client, stage_params=params)
    assert guided == speak(client, stage_params=params, guidance_scale=3.0)
    assert guided != speak(client, stage_params=params, guidance_scale=1.0)


def test_disconnect_mid_stream_frees_both_stages(http: httpx.Client, server) -> None:
    """A client that leaves while the codec streams and the decoder still generates: the request is aborted
    in both stages, neither holds it afterwards, and the server serves on."""
    endless = [{"temperature": 0.0, "max_tokens": 3000, "min_tokens": 3000}, {}]
    body = {"model": model(), "input": TEXT, "response_format": "pcm", "voice": "default"}
    body |= {"stage_params": endless, "stream": True}
    speech_family.leave_mid_stream(http, server, model(), body, ("decoder", "codec"))
    assert (
        http.post("/v1/audio/speech", json={**body, "stage_params": GREEDY, "stream": False}).status_code
        == 200
    )


def test_an_uploaded_voice_survives_a_restart(client: OpenAI, server, dirs) -> None:
    """Last: the module's server stops, and a new one on the same voices directory speaks the voice alike."""
    before = speak(client, voice="teller")
    server.stop()
    again = start(dirs[0], dirs[1] / "restarted.log")
    try:
        with OpenAI(base_url=again.url + "/v1", api_key="unused", max_retries=0) as fresh:
            assert speak(fresh, voice="teller") == before
    finally:
        again.stop()
