"""/v1/audio/voices on the real speaking models: each model's own voices (the demo voice's OpenAI names are
aliases of its one voice), uploads that are the voice's own speech, kept as one file each and found again by
a restarted server, refused where they are not audio or too big, and refused by models that cannot clone."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
from safetensors import safe_open

from omnistage.serving.media import decode_audio
from tests.speech.conftest import CHAT_MODEL, VOICE_MODEL
from tests.speech.stages import wait_idle
from tests.support.server_process import ServerProcess
from tests.support.voice_demo import WHISPER

pytestmark = pytest.mark.e2e
OPENAI_VOICES = {
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
}


def spoken_wav(client: openai.OpenAI, text: str) -> bytes:
    speech = client.audio.speech
    return speech.create(model=VOICE_MODEL, input=text, voice="heart", extra_body={"seed": 1}).content


def upload(http, name: str, data: bytes, **fields: str):
    files = {"audio_sample": (f"{name}.wav", data, "audio/wav")}
    return http.post("/v1/audio/voices", files=files, data={"name": name, "consent": "consent-1", **fields})


def upload_without_consent(http, data: bytes):
    return http.post("/v1/audio/voices", files={"audio_sample": ("a.wav", data)}, data={"name": "x"})


def test_each_model_lists_its_voice_and_the_aliases(speech_http):
    listing = speech_http.get("/v1/audio/voices").json()
    by_model = {m["model"]: m for m in listing["models"]}
    # the server's models that speak (the shared server also serves the tiny omni model, with its speakers);
    # Whisper, which only listens, is not listed
    assert {VOICE_MODEL, CHAT_MODEL} <= set(by_model) and WHISPER not in by_model
    for entry in (by_model[VOICE_MODEL], by_model[CHAT_MODEL]):
        assert entry["voices"] == ["heart"] and entry["clones_voices"] is False
        assert entry["aliases"] == {name: "heart" for name in OPENAI_VOICES}
    assert set(listing["voices"]) >= OPENAI_VOICES | {"heart"}
    assert listing["voices"] == sorted(listing["voices"])
    only = speech_http.get("/v1/audio/voices", params={"model": VOICE_MODEL}).json()
    assert [m["model"] for m in only["models"]] == [VOICE_MODEL]


def test_upload_list_use_and_delete(speech_client, speech_http, voices_dir):
    wav = spoken_wav(speech_client, "This is my own voice sample.")
    reply = upload(speech_http, "sample_voice", wav, ref_text="This is my own voice sample.")
    assert reply.status_code == 200, reply.text
    voice = reply.json()["voice"]
    assert voice["name"] == "sample_voice" and voice["consent"] == "consent-1"
    assert voice["file_size"] == len(wav) and voice["mime_type"] == "audio/wav"
    assert voice["sample_rate"] == 24000 and voice["ref_text"] == "This is my own voice sample."

    # One file, its samples the upload's, its metadata in the header.
    stored = voices_dir / "sample_voice.safetensors"
    with safe_open(stored, "np") as handle:
        assert handle.metadata()["name"] == "sample_voice"
        samples = handle.get_tensor("audio")
    expected, rate = decode_audio(wav, param="x")
    assert rate == 24000 and np.array_equal(samples, expected)

    listing = speech_http.get("/v1/audio/voices").json()
    assert "sample_voice" in listing["voices"]
    assert [v["name"] for v in listing["uploaded_voices"]] == ["sample_voice"]

    # Neither speaking model clones: the uploaded voice is a 400 naming the model, on every route.
    with pytest.raises(openai.BadRequestError) as refused:
        speech_client.audio.speech.create(model=VOICE_MODEL, input="Hello.", voice="sample_voice")
    assert refused.value.body["param"] == "voice"
    assert f"model '{VOICE_MODEL}' cannot speak in uploaded voices" in refused.value.body["message"]
    batch = speech_http.post(
        "/v1/audio/speech/batch",
        json={"model": VOICE_MODEL, "items": [{"input": "Hi.", "voice": "sample_voice"}]},
    ).json()
    assert batch["failed"] == 1 and "cannot speak in uploaded voices" in batch["results"][0]["error"]

    # Any container the decoders read: the same speech as FLAC is the same samples.
    flac = speech_client.audio.speech.create(
        model=VOICE_MODEL,
        input="This is my own voice sample.",
        voice="heart",
        response_format="flac",
        extra_body={"seed": 1},
    ).content
    files = {"audio_sample": ("s.flac", flac, "audio/flac")}
    reply = speech_http.post("/v1/audio/voices", files=files, data={"name": "sample_flac", "consent": "c2"})
    assert reply.status_code == 200 and reply.json()["voice"]["mime_type"] == "audio/flac"
    with safe_open(voices_dir / "sample_flac.safetensors", "np") as handle:
        assert np.abs(handle.get_tensor("audio") - expected).max() <= 1 / 32767 + 1e-6
    assert speech_http.delete("/v1/audio/voices/sample_flac").status_code == 200

    deleted = speech_http.delete("/v1/audio/voices/sample_voice")
    assert deleted.status_code == 200 and deleted.json()["success"] is True
    assert not stored.exists()
    assert "sample_voice" not in speech_http.get("/v1/audio/voices").json()["voices"]
    again = speech_http.delete("/v1/audio/voices/sample_voice")
    assert again.status_code == 404 and again.json()["error"]["param"] == "name"
    wait_idle(speech_http, VOICE_MODEL)


def test_bad_uploads_are_400_naming_the_field(speech_client, speech_http, voices_dir):
    wav = spoken_wav(speech_client, "Short.")
    cases = [
        (upload(speech_http, "not_audio", b"GIF89a" + bytes(2000)), "audio_sample", "not a decodable audio"),
        (
            upload(speech_http, "too_big", b"\0" * (10 * 1024 * 1024 + 1)),
            "audio_sample",
            "voice upload limit",
        ),
        (upload(speech_http, "heart", wav), "name", "own voice"),  # a model's own voice name
        (upload(speech_http, "bad/name", wav), "name", ""),
        (
            speech_http.post("/v1/audio/voices", files={"audio_sample": ("a.wav", wav)}, data={"name": "x"}),
            "consent",
            "",
        ),
    ]
    for response, param, text in cases:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and text in error["message"], error
    left = {p.name for p in voices_dir.iterdir()}
    assert not {n for n in left if n.startswith((".", "not_audio", "too_big", "heart", "x."))}, left


def test_uploaded_voices_survive_a_restart(speech_client, tmp_path):
    from omnistage.demo.voice import voice_dir

    wav = spoken_wav(speech_client, "Remember me after a restart.")
    voices = tmp_path / "voices"
    args = ["serve", str(voice_dir()), "--num-threads", "1", "--voices-dir", str(voices)]

    def listing(server: ServerProcess) -> dict:
        return httpx.get(server.url + "/v1/audio/voices", timeout=30).json()

    first = ServerProcess(args, tmp_path / "first.log", module="omnistage")
    try:
        first.wait_healthy(timeout=300)
        with httpx.Client(base_url=first.url, timeout=60) as http:
            assert upload(http, "kept", wav, ref_text="Remember me after a restart.").status_code == 200
            assert upload(http, "dropped", wav).status_code == 200
            assert http.delete("/v1/audio/voices/dropped").status_code == 200
        before = listing(first)["uploaded_voices"]
    finally:
        assert first.stop() == 0
    second = ServerProcess(args, tmp_path / "second.log", module="omnistage")
    try:
        second.wait_healthy(timeout=300)
        after = listing(second)
    finally:
        assert second.stop() == 0
    assert [v["name"] for v in after["uploaded_voices"]] == ["kept"]
    assert after["uploaded_voices"] == before
    assert "kept" in after["voices"] and "dropped" not in after["voices"]
    assert sorted(p.name for p in voices.iterdir()) == ["kept.safetensors"]
