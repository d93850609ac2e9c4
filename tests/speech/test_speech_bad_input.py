"""Bad input on /v1/audio/speech (the official client's call), on the real voice: each a 400 naming the
field and its rule, and nothing left running in any stage afterwards."""

from __future__ import annotations

import openai
import pytest

from tests.speech.conftest import CHAT_MODEL, VOICE_MODEL
from tests.speech.stages import wait_idle

pytestmark = pytest.mark.e2e

CASES = [
    ({"input": ""}, "input", "cannot be empty"),
    ({"input": "   "}, "input", "cannot be empty"),
    ({"input": "x" * 4097}, "input", "4096"),
    ({"input": "Hello.", "voice": "nobody"}, "voice", "unknown voice 'nobody'"),
    ({"input": "Hello.", "response_format": "ogg"}, "response_format", ""),
    ({"input": "Hello.", "speed": 3.0}, "speed", "[0.5, 2.0]"),
    ({"input": "Hello.", "speed": 9.0}, "speed", ""),
    (
        {"input": "Hello.", "response_format": "mp3", "extra_body": {"stream_format": "audio"}},
        "response_format",
        "'pcm' or 'wav'",
    ),
    ({"input": "Hello.", "extra_body": {"sample_rate": 100}}, "sample_rate", ""),
    ({"input": "🙂 🙂 🙂"}, "input", "nothing it can say"),  # reaches the voice stage, which refuses it
    ({"input": "Hello.", "model": CHAT_MODEL}, "model", "does not serve /v1/audio/speech"),
    (
        {"input": "Hello.", "extra_body": {"ref_audio": "data:audio/wav;base64,AAAA"}},
        "ref_audio",
        "does not take",
    ),
    ({"input": "Hello.", "extra_body": {"task_type": "Base"}}, "task_type", "does not take task_type"),
    ({"input": "Hello.", "extra_body": {"task_type": "Clone"}}, "task_type", ""),
]


@pytest.mark.parametrize(("fields", "param", "text"), CASES)
def test_bad_speech_requests_are_400_naming_the_field(speech_client, speech_http, fields, param, text):
    call = {"model": VOICE_MODEL, "voice": "heart", **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        speech_client.audio.speech.create(**call)
    error = refused.value.body
    assert error["param"] == param and text in error["message"], error
    wait_idle(speech_http, VOICE_MODEL)
    wait_idle(speech_http, CHAT_MODEL)


def test_a_bad_stream_is_refused_before_it_starts(speech_client, speech_http):
    call = {"model": VOICE_MODEL, "voice": "heart", "input": "Hello.", "response_format": "flac"}
    stream = speech_client.audio.speech.with_streaming_response
    with pytest.raises(openai.BadRequestError) as refused, stream.create(**call, extra_body={"stream": True}):
        pass
    assert refused.value.body["param"] == "response_format"
    wait_idle(speech_http, VOICE_MODEL)
