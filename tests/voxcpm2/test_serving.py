"""VoxCPM2 served by `omnistage serve` with its default deploy (both stages as processes, async chunk),
through the official `openai` client where it has the call: speech, its SSE and raw streams equal to the
whole, the batch and the streaming-text WebSocket speaking the same audio (a request's seed is its noise's); a
voice uploaded with its transcript is continued as the same clip given inline, and still is after a restart;
bad fields answer 400 naming them; a client that leaves mid-stream frees both stages."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI

from omnistage.families.voxcpm2.tiny import tiny_voxcpm2_dir
from tests.support import speech_family
from tests.voxcpm2.reference import clip

pytestmark = pytest.mark.engine

GREEDY = [{"seed": 8, "max_tokens": 30}, {}]  # seeded: the same noise, the same audio
TEXT = "The quick brown fox jumps over the lazy dog."  # 30 patches (tests/voxcpm2)
REF_TEXT = "Once upon a time."


dirs, server, http, client = speech_family.module_fixtures(tiny_voxcpm2_dir, "voxcpm2")


def model() -> str:
    return tiny_voxcpm2_dir().name


def speaker(client: OpenAI) -> speech_family.Speaker:
    return speech_family.Speaker(client, model(), TEXT, GREEDY, 16000)


def speak(client: OpenAI, text: str = TEXT, **extra) -> bytes:
    return speaker(client).speak(text, **extra)


def test_every_route_speaks_the_same_audio(client: OpenAI, http: httpx.Client, server) -> None:
    speaker(client).every_route_speaks_the_same_audio(
        http, server, "Something else entirely.", {"ref_text": REF_TEXT}
    )


def test_an_uploaded_voice_is_continued_as_its_clip(client: OpenAI, http: httpx.Client) -> None:
    voice = speaker(client)
    voice.an_uploaded_voice_is_its_clip(http, voice.wav(clip(0.3, 180.0)), REF_TEXT)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"voice": "nobody"}, "voice"),
        ({"ref_text": REF_TEXT}, "ref_text"),
        ({"ref_audio": "data:audio/wav;base64,AAAA", "ref_text": REF_TEXT}, "ref_audio"),
        ({"ref_audio": "/etc/hostname", "ref_text": REF_TEXT}, "ref_audio"),
        ({"instructions": "Speak warmly"}, "instructions"),
        ({"speaker_id": 1}, "speaker_id"),
        ({"cfg_value": 0.5}, "cfg_value"),
        ({"inference_timesteps": 0}, "inference_timesteps"),
    ],
)
def test_bad_fields_are_400_naming_them(client: OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        speak(client, **extra)
    assert refused.value.status_code == 400 and speech_family.refused_param(refused.value) == param


def test_the_family_options_reach_the_decoder(client: OpenAI) -> None:
    """`cfg_value` and `inference_timesteps` change the patches (the defaults, 2.0 and 10, are the same as
    leaving them out)."""
    base = speak(client)
    assert base == speak(client, cfg_value=2.0, inference_timesteps=10)
    assert base != speak(client, cfg_value=3.0) and base != speak(client, inference_timesteps=4)


def test_disconnect_mid_stream_frees_both_stages(http: httpx.Client, server) -> None:
    """A client that leaves while the codec streams and the decoder still generates: the request is aborted
    in both stages, neither holds it afterwards, and the server serves on."""
    endless = [{"seed": 1, "max_tokens": 2000, "min_tokens": 2000}, {}]
    body = {"model": model(), "input": " ".join([TEXT] * 20), "response_format": "pcm", "voice": "default"}
    body |= {"stage_params": endless, "stream": True}
    speech_family.leave_mid_stream(http, server, model(), body, ("decoder", "vae"))
    assert (
        http.post(
            "/v1/audio/speech", json={**body, "input": TEXT, "stage_params": GREEDY, "stream": False}
        ).status_code
        == 200
    )
