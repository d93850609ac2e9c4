"""VibeVoice served by `omnistage serve` with its default deploy (both stages as processes, async chunk),
through the official `openai` client where it has the call: speech, its SSE and raw streams, the batch and
the streaming-text WebSocket speak alike (a request's seed is its noise's); a voice uploaded is cloned as the
same clip given inline, and still is after a restart; in a two-speaker script, Speaker 1's clip in
`speaker_clips` changes the audio; bad fields answer 400 naming them; a client that leaves mid-stream frees
both stages."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest
from openai import OpenAI

from omnistage.families.vibevoice.tiny import tiny_vibevoice_dir
from tests.support import speech_family
from tests.vibevoice.reference import PROMPTS, clip

pytestmark = pytest.mark.engine

SEEDED = [{"seed": 8, "max_tokens": 12}, {}]  # seeded: the same noise, the same audio
TEXT = PROMPTS[0]  # one sentence: the WebSocket speaks sentence by sentence, each a request
SCRIPT = PROMPTS[1]  # Speaker 0 and Speaker 1


dirs, server, http, client = speech_family.module_fixtures(tiny_vibevoice_dir, "vibevoice")


def model() -> str:
    return tiny_vibevoice_dir().name


def speaker(client: OpenAI) -> speech_family.Speaker:
    return speech_family.Speaker(client, model(), TEXT, SEEDED, 24000)


def speak(client: OpenAI, text: str = TEXT, **extra) -> bytes:
    return speaker(client).speak(text, **extra)


def data_url(client: OpenAI, seconds: float, pitch: float) -> str:
    return "data:audio/wav;base64," + base64.b64encode(speaker(client).wav(clip(seconds, pitch))).decode()


def test_every_route_speaks_the_same_audio(client: OpenAI, http: httpx.Client, server) -> None:
    speaker(client).every_route_speaks_the_same_audio(
        http, server, "Speaker 0: Something else.", {"cfg_scale": 0.5}
    )


def test_an_uploaded_voice_is_cloned_as_its_clip(client: OpenAI, http: httpx.Client) -> None:
    voice = speaker(client)
    voice.an_uploaded_voice_is_its_clip(http, voice.wav(clip(0.05, 180.0)), None)


def test_speaker_clips_and_the_family_options_reach_the_lm(client: OpenAI) -> None:
    """Speaker 1's clip changes the audio, as do `cfg_scale` and `diffusion_steps` (the checkpoint's 1.3
    and 10 are the same as leaving them out)."""
    base = speak(client, SCRIPT)
    cloned = speak(client, SCRIPT, speaker_clips=[{"speaker": 1, "audio": data_url(client, 0.05, 220.0)}])
    assert cloned != base and len(cloned) == len(base)
    assert base == speak(client, SCRIPT, cfg_scale=1.3, diffusion_steps=10)
    assert base != speak(client, SCRIPT, cfg_scale=3.0) and base != speak(client, SCRIPT, diffusion_steps=4)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"voice": "nobody"}, "voice"),
        ({"ref_audio": "data:audio/wav;base64,AAAA"}, "ref_audio"),
        ({"instructions": "Speak warmly"}, "instructions"),
        ({"ref_text": "Once upon a time."}, "ref_text"),
        ({"cfg_scale": 0.5}, "cfg_scale"),
        ({"diffusion_steps": 0}, "diffusion_steps"),
        ({"speaker_clips": [{"speaker": 4, "audio": "data:audio/wav;base64,AAAA"}]}, "speaker_clips"),
        ({"input": "Speaker 7: Hello."}, "input"),
    ],
)
def test_bad_fields_are_400_naming_them(client: OpenAI, extra: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        speak(client, **extra)
    assert refused.value.status_code == 400 and speech_family.refused_param(refused.value) == param


def test_disconnect_mid_stream_frees_both_stages(http: httpx.Client, server) -> None:
    """A client that leaves while the audio streams and the LM still speaks: the request is aborted in both
    stages, neither holds it afterwards, and the server serves on."""
    endless = [{"seed": 1, "max_tokens": 2000}, {}]
    body = {
        "model": model(),
        "input": " ".join([PROMPTS[0]] * 40),
        "response_format": "pcm",
        "voice": "default",
    }
    body |= {"stage_params": endless, "stream": True}
    speech_family.leave_mid_stream(http, server, model(), body, ("lm", "audio"))
    again = {**body, "input": TEXT, "stage_params": SEEDED, "stream": False}
    assert http.post("/v1/audio/speech", json=again).status_code == 200
