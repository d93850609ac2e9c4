"""Higgs Audio v2 served by `omnistage serve` with its default deploy (both stages as processes, async
chunk), through the official `openai` client: speech equal to the reference's waveform (PCM16), its SSE and
raw streams, the batch and the streaming-text WebSocket the same audio; a voice uploaded with its transcript
speaks as the same clip given inline, and still does after a restart; bad fields answer 400 naming them; a
client that leaves mid-stream frees both stages."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI
from websockets.sync.client import connect

from omnistage.families.higgs_audio_v2.tiny import tiny_higgs_dir
from tests.higgs_audio_v2.reference import CLONE, PROMPTS, reference_waveform
from tests.higgs_audio_v2.test_pipeline import wav
from tests.support import speech_family

pytestmark = pytest.mark.engine

MAX_NEW = 24
GREEDY = [{"temperature": 0.0, "max_tokens": MAX_NEW}, {}]
TEXT = PROMPTS[3][0]
REF_TEXT, REF_CLIP = CLONE[2]


dirs, server, http, client = speech_family.module_fixtures(tiny_higgs_dir, "higgs")


def model() -> str:
    return tiny_higgs_dir().name


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


def pcm(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32767


def data_url(samples) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav(samples)).decode()


def test_speech_and_its_stream_are_the_reference_waveform(client: OpenAI) -> None:
    whole = speak(client)
    want = reference_waveform(TEXT, None, None).numpy()
    assert len(whole) == 2 * len(want)
    assert float(np.abs(pcm(whole) - np.clip(want, -1, 1)).max()) <= 2 / 32767  # PCM16 rounding
    deltas, done = [], None
    stream = client.audio.speech.with_streaming_response
    with stream.create(model=model(), voice="default", input=TEXT, response_format="pcm",
                       extra_body={"stage_params": GREEDY, "stream": True,
                                   "initial_codec_chunk_frames": 2}) as reply:  # fmt: skip
        for line in reply.iter_lines():
            if line.startswith("data:"):
                data = json.loads(line[5:])
                if data["type"] == "speech.audio.delta":
                    deltas.append(base64.b64decode(data["audio"]))
                else:
                    done = data
    assert done is not None and done["type"] == "speech.audio.done", done
    assert len(deltas) >= 2 and b"".join(deltas) == whole  # async chunks, joined: the same audio


def test_an_uploaded_voice_speaks_as_its_clip_inline(client: OpenAI, http: httpx.Client) -> None:
    got = http.post(
        "/v1/audio/voices",
        data={"name": "teller", "consent": "yes", "ref_text": REF_TEXT},
        files={"audio_sample": ("teller.wav", wav(REF_CLIP), "audio/wav")},
    )
    assert got.status_code == 200, got.text
    uploaded = speak(client, CLONE[0], voice="teller")
    inline = speak(client, CLONE[0], ref_audio=data_url(REF_CLIP), ref_text=REF_TEXT)
    assert uploaded == inline != speak(client, CLONE[0])
    want = reference_waveform(*CLONE).numpy()
    assert float(np.abs(pcm(inline) - np.clip(want, -1, 1)).max()) <= 2 / 32767


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"voice": "nobody"}, "voice"),
        ({"ref_text": REF_TEXT}, "ref_text"),
        ({"ref_audio": "data:audio/wav;base64,AAAA", "ref_text": REF_TEXT}, "ref_audio"),
        ({"ref_audio": "/etc/hostname", "ref_text": REF_TEXT}, "ref_audio"),
        ({"scene": "A quiet room.", "instructions": "Speak warmly"}, "scene"),
        ({"initial_codec_chunk_frames": -1}, "initial_codec_chunk_frames"),
        ({"speaker_id": 1}, "speaker_id"),
    ],
)
def test_bad_fields_are_400_naming_them(client: OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        speak(client, **extra)
    assert refused.value.status_code == 400 and speech_family.refused_param(refused.value) == param


def test_raw_stream_batch_and_websocket_speak_the_same_audio(
    client: OpenAI, http: httpx.Client, server
) -> None:
    whole = speak(client)
    stream = client.audio.speech.with_streaming_response
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
        assert json.loads(ws.recv(timeout=120))["type"] == "audio.start"
        chunks = []
        while isinstance(message := ws.recv(timeout=120), bytes):
            chunks.append(message)
        assert json.loads(message)["type"] == "audio.done"
    assert b"".join(chunks) == whole


def test_disconnect_mid_stream_frees_both_stages(http: httpx.Client, server) -> None:
    """A client that leaves while the codec streams and the talker still generates: the request is aborted
    in both stages, neither holds it afterwards, and the server serves on."""
    endless = [{"temperature": 0.0, "max_tokens": 2000, "min_tokens": 2000}, {}]
    body = {"model": model(), "input": TEXT, "response_format": "pcm", "voice": "default"}
    body |= {"stage_params": endless, "stream": True, "initial_codec_chunk_frames": 2}
    speech_family.leave_mid_stream(http, server, model(), body, ("talker", "codec"))
    assert (
        http.post("/v1/audio/speech", json={**body, "stage_params": GREEDY, "stream": False}).status_code
        == 200
    )
