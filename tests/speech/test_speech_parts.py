"""The speech API's parts that need no model: the sentence splitter of the WebSocket, the voice store's
files and limits, and the socket's idle timeout and key check (in-process app, no models)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omnistage.errors import InvalidRequestError, NotFoundError
from omnistage.serving.app import create_app
from omnistage.serving.sentences import split_sentences
from omnistage.serving.settings import ServerSettings
from omnistage.serving.voices import VoiceStore

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "final", "expected"),
    [
        ("Hello there. How are", False, (["Hello there."], "How are")),
        ("Hello there. How are you?", False, (["Hello there."], "How are you?")),  # "?" may still grow
        ("Hello there. How are you? ", False, (["Hello there.", "How are you?"], "")),
        ("Hello there. How are you?", True, (["Hello there.", "How are you?"], "")),
        ("It costs 3.50 dollars. Then", False, (["It costs 3.50 dollars."], "Then")),
        ('He said "stop!" and left', False, (['He said "stop!"'], "and left")),
        ("Wait... what?! Yes", True, (["Wait...", "what?!", "Yes"], "")),
        ("你好。世界", False, (["你好。"], "世界")),
        ("...  ", True, ([], "")),
        ("no end yet", False, ([], "no end yet")),
    ],
)
def test_sentences_end_where_the_text_shows_they_end(text, final, expected):
    assert split_sentences(text, final) == expected


def test_sentences_are_the_same_whole_or_in_pieces():
    text = "First one here. A second, longer sentence follows! And a third? The end."
    whole, _ = split_sentences(text, final=True)
    got, rest = [], ""
    for i in range(0, len(text), 5):
        done, rest = split_sentences(rest + text[i : i + 5], final=False)
        got += done
    got += split_sentences(rest, final=True)[0]
    assert (
        got == whole == ["First one here.", "A second, longer sentence follows!", "And a third?", "The end."]
    )


def test_voice_store_keeps_one_file_per_voice_and_its_limits(tmp_path):
    store = VoiceStore(tmp_path, max_count=2)
    samples = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)
    store.add("a", samples, 16000, consent="c1", mime_type="audio/wav", file_size=3244, ref_text="hi")
    store.add("b", samples[:800], 8000, consent="c2", mime_type="audio/flac", file_size=900)
    with pytest.raises(InvalidRequestError) as full:
        store.add("c", samples, 16000, consent="c3", mime_type="audio/wav", file_size=1)
    assert full.value.param == "audio_sample" and "maximum of 2" in full.value.message
    store.add("a", samples[:10], 16000, consent="c4", mime_type="audio/wav", file_size=5)  # replaces
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")  # skipped on scan
    again = VoiceStore(tmp_path, max_count=2)
    assert [v.name for v in again.list()] == ["a", "b"]
    a, b = again.list()
    assert (a.consent, a.file_size, a.ref_text, len(a.samples())) == ("c4", 5, None, 10)
    assert (b.sample_rate, b.mime_type, b.ref_text) == (8000, "audio/flac", None)
    assert np.array_equal(b.samples(), samples[:800])
    assert "ref_text" not in b.describe() and again.get("zed") is None
    again.delete("b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "junk.safetensors"]
    with pytest.raises(NotFoundError):
        again.delete("b")
    with pytest.raises(InvalidRequestError) as bad:
        again.add("../up", samples, 16000, consent="c", mime_type="audio/wav", file_size=1)
    assert bad.value.param == "name"


def test_uploads_over_the_size_or_count_setting_are_400(tmp_path):
    buf = io.BytesIO()
    sf.write(buf, np.zeros(800, dtype=np.float32), 8000, format="WAV")
    wav = buf.getvalue()
    settings = ServerSettings(voices_dir=tmp_path, max_voice_upload_bytes=len(wav), max_uploaded_voices=1)

    def upload(client, name: str, data: bytes):
        files = {"audio_sample": ("v.wav", data, "audio/wav")}
        return client.post("/v1/audio/voices", files=files, data={"name": name, "consent": "yes"})

    with TestClient(create_app({}, settings)) as client:
        assert upload(client, "one", wav).status_code == 200
        too_big = upload(client, "two", wav + b"\0")
        assert too_big.status_code == 400 and "upload limit" in too_big.json()["error"]["message"]
        full = upload(client, "two", wav)
        assert full.status_code == 400 and full.json()["error"]["param"] == "audio_sample"
        assert upload(client, "one", wav).status_code == 200  # replacing a voice needs no room
    with TestClient(create_app({}, settings)) as client:  # a restart on the same dir
        listed = client.get("/v1/audio/voices").json()
    assert listed["voices"] == ["one"] and listed["uploaded_voices"][0]["mime_type"] == "audio/wav"


def test_an_idle_socket_is_closed_and_a_keyless_one_refused(tmp_path):
    settings = ServerSettings(api_key="k", voices_dir=tmp_path, speech_stream_idle_timeout_s=0.05)
    with TestClient(create_app({}, settings)) as client:
        with (
            pytest.raises(WebSocketDisconnect) as refused,
            client.websocket_connect("/v1/audio/speech/stream"),
        ):
            pass
        assert refused.value.code == 1008
        headers = {"Authorization": "Bearer k"}
        with client.websocket_connect("/v1/audio/speech/stream", headers=headers) as ws:
            ws.send_json({"type": "session.config"})  # no model serves speech here: an error, not the end
            error = ws.receive_json()
            assert error["type"] == "error" and error["param"] == "model"
            idle = ws.receive_json()  # then nothing is sent: the server gives up on the client
            assert idle["type"] == "error" and "idle" in idle["message"]
            closed = ws.receive()
            assert closed == {"type": "websocket.close", "code": 1000, "reason": ""}


def test_qwen2_5_omni_lists_its_checkpoints_speakers(tmp_path):
    """The per-checkpoint seam: the family names `voices_of`, serving calls it with the model dir."""
    from types import SimpleNamespace

    from omnistage.families.qwen2_5_omni.loaders import load_speakers
    from omnistage.families.qwen2_5_omni.pipeline import QWEN2_5_OMNI
    from omnistage.families.qwen2_5_omni.tiny import qwen2_5_omni_dir
    from omnistage.serving.served import ServedModel, ServedModels
    from omnistage.serving.voices import Voices

    model_dir = qwen2_5_omni_dir()
    speakers = sorted(load_speakers(model_dir))
    assert speakers  # the tiny checkpoint's spk_dict.pt
    runtime = SimpleNamespace(model_dir=str(model_dir), pipeline=QWEN2_5_OMNI, model_name="omni")
    models = ServedModels({"omni": runtime})
    voices = Voices(models, VoiceStore(tmp_path, max_count=1))
    assert voices.models["omni"].describe() == {
        "model": "omni",
        "voices": speakers,
        "aliases": {},
        "clones_voices": False,
    }
    model: ServedModel = models.models["omni"]
    assert voices.check(model, speakers[0]) is None
    with pytest.raises(InvalidRequestError) as unknown:
        voices.check(model, "nobody")
    assert unknown.value.param == "voice" and speakers[0] in unknown.value.message
