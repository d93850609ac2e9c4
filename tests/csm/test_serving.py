"""CSM served by `omnistage serve` with its default deploy (both stages as processes, async chunk), through
the official `openai` client where it has the call: speech, its SSE and raw streams equal to the whole, the
batch and the streaming-text WebSocket speaking the same audio; a voice uploaded with its transcript speaks
as the same clip given inline or as a context turn, and still does after a restart; bad fields answer 400
naming them; a client that leaves mid-stream frees both stages."""

from __future__ import annotations

import base64
import json

import httpx
import openai
import pytest
from openai import OpenAI
from websockets.sync.client import connect

from omnistage.families.csm.tiny import tiny_csm_dir
from tests.csm.reference import clip, wav
from tests.support import speech_family

pytestmark = pytest.mark.engine

FRAME = 1920
GREEDY = [{"temperature": 0.0, "max_tokens": 16}, {}]
TEXT = "Hello there, a test!"
REF_TEXT = "Once upon a time."


dirs, server, http, client = speech_family.module_fixtures(tiny_csm_dir, "csm")


def model() -> str:
    return tiny_csm_dir().name


def speak(client: OpenAI, **extra) -> bytes:
    voice = extra.pop("voice", "0")
    reply = client.audio.speech.create(
        model=model(),
        voice=voice,
        input=TEXT,
        response_format="pcm",
        extra_body={"stage_params": GREEDY, **extra},
    )
    return reply.content


def test_every_route_speaks_the_same_audio(client: OpenAI, http: httpx.Client, server) -> None:
    whole = speak(client)
    assert len(whole) == 16 * FRAME * 2  # 16 frames of PCM16
    assert speak(client, voice="1") != whole  # another speaker

    deltas, done = [], None
    stream = client.audio.speech.with_streaming_response
    with stream.create(model=model(), voice="0", input=TEXT, response_format="pcm",
                       extra_body={"stage_params": GREEDY, "stream": True}) as reply:  # fmt: skip
        assert reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line.startswith("data:"):
                data = json.loads(line[5:])
                if data["type"] == "speech.audio.delta":
                    deltas.append(base64.b64decode(data["audio"]))
                else:
                    done = data
    assert done is not None and done["type"] == "speech.audio.done", done
    assert len(deltas) >= 2 and b"".join(deltas) == whole  # async chunks, joined: the same audio

    with stream.create(model=model(), voice="0", input=TEXT, response_format="pcm",
                       extra_body={"stage_params": GREEDY, "stream_format": "audio"}) as reply:  # fmt: skip
        assert b"".join(reply.iter_bytes()) == whole

    fields = {"voice": "0", "stage_params": GREEDY, "response_format": "pcm"}
    items = [{"input": TEXT}, {"input": "  "}, {"input": TEXT, "speaker_id": "x"}]
    batch = http.post("/v1/audio/speech/batch", json={"model": model(), **fields, "items": items})
    assert batch.status_code == 200, batch.text
    results = batch.json()["results"]
    assert [r["status"] for r in results] == ["success", "error", "error"]
    assert base64.b64decode(results[0]["audio_data"]) == whole
    assert results[1]["param"] == "input" and results[2]["param"] == "speaker_id"

    with connect(server.url.replace("http", "ws") + "/v1/audio/speech/stream", max_size=None) as ws:
        ws.send(json.dumps({"type": "session.config", "model": model(), **fields}))
        ws.send(json.dumps({"type": "input.text", "text": TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
        start_event = json.loads(ws.recv(timeout=120))
        assert start_event["type"] == "audio.start" and start_event["sample_rate"] == 24000
        chunks = []
        while isinstance(message := ws.recv(timeout=120), bytes):
            chunks.append(message)
        assert json.loads(message)["type"] == "audio.done"
    assert b"".join(chunks) == whole


def data_url(samples) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav(samples)).decode()


def test_a_voice_speaks_by_its_clip_as_context(client: OpenAI, http: httpx.Client) -> None:
    sample = clip(1.0, 180.0)
    got = http.post(
        "/v1/audio/voices",
        data={"name": "teller", "consent": "yes", "ref_text": REF_TEXT},
        files={"audio_sample": ("teller.wav", wav(sample), "audio/wav")},
    )
    assert got.status_code == 200, got.text
    uploaded = speak(client, voice="teller")
    inline = speak(client, ref_audio=data_url(sample), ref_text=REF_TEXT)
    turn = speak(client, context=[{"speaker": 0, "text": REF_TEXT, "audio": data_url(sample)}])
    assert uploaded == inline == turn != speak(client)
    other = speak(client, voice="teller", speaker_id=1)
    assert other != uploaded
    entry = http.get("/v1/audio/voices", params={"model": model()}).json()["models"][0]
    assert entry["voices"] == ["0", "1"] and entry["clones_voices"] is True


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"voice": "7"}, "voice"),
        ({"speaker_id": -1}, "speaker_id"),
        ({"voice": "0", "speaker_id": 1}, "speaker_id"),
        ({"ref_text": REF_TEXT}, "ref_text"),
        ({"ref_audio": "data:audio/wav;base64,AAAA", "ref_text": REF_TEXT}, "context[0].audio"),
        ({"ref_audio": "/etc/hostname", "ref_text": REF_TEXT}, "ref_audio"),
        ({"context": [{"speaker": 0, "audio": "data:audio/wav;base64,AAAA"}]}, "context[0].text"),
        ({"context": [{"speaker": 0, "text": "x", "audio": "ftp://x/a.wav"}]}, "context[0].audio"),
        ({"context": "no"}, "context"),
        ({"instructions": "Speak warmly"}, "instructions"),
        ({"initial_codec_chunk_frames": -1}, "initial_codec_chunk_frames"),
    ],
)
def test_bad_fields_are_400_naming_them(client: OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        speak(client, **extra)
    assert refused.value.status_code == 400 and speech_family.refused_param(refused.value) == param


def test_disconnect_mid_stream_frees_both_stages(http: httpx.Client, server) -> None:
    """A client that leaves while the codec streams and the backbone still generates: the request is aborted
    in both stages, neither holds it afterwards, and the server serves on."""
    endless = [{"temperature": 0.0, "max_tokens": 2000, "min_tokens": 2000}, {}]
    body = {"model": model(), "input": TEXT, "response_format": "pcm", "voice": "0"}
    body |= {"stage_params": endless, "stream": True, "initial_codec_chunk_frames": 2}
    speech_family.leave_mid_stream(http, server, model(), body, ("backbone", "codec"))
    assert (
        http.post("/v1/audio/speech", json={**body, "stage_params": GREEDY, "stream": False}).status_code
        == 200
    )
