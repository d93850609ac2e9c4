"""Dia served by `omnistage serve` with its default deploy (both stages as processes, async chunk), through
the official `openai` client where it has the call: speech, its SSE and raw streams equal to the whole, the
batch and the streaming-text WebSocket speaking the same audio; a voice uploaded with its transcript is
continued as the same clip given inline, and still is after a restart; bad fields answer 400 naming them; a
client that leaves mid-stream frees both stages."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai import OpenAI

from omnistage.families.dia.tiny import tiny_dia_dir
from tests.dia.reference import clip
from tests.support import speech_family

pytestmark = pytest.mark.engine

GREEDY = [{"temperature": 0.0, "max_tokens": 40}, {}]
TEXT = "[S1] The quick brown fox jumps over the lazy dog."  # ends at the 40-frame limit (tests/dia)
REF_TEXT = "[S1] Once upon a time."


dirs, server, http, client = speech_family.module_fixtures(tiny_dia_dir, "dia")


def model() -> str:
    return tiny_dia_dir().name


def speaker(client: OpenAI) -> speech_family.Speaker:
    return speech_family.Speaker(client, model(), TEXT, GREEDY, 44100)


def speak(client: OpenAI, text: str = TEXT, **extra) -> bytes:
    return speaker(client).speak(text, **extra)


def test_every_route_speaks_the_same_audio(client: OpenAI, http: httpx.Client, server) -> None:
    speaker(client).every_route_speaks_the_same_audio(
        http, server, "[S2] Something else entirely.", {"ref_text": REF_TEXT}
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
