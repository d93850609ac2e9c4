"""POST /v1/audio/speech/batch on the real voice: every item is the same speech `/v1/audio/speech` gives for
the same fields, the batch's fields under each item's own, and bad items fail alone."""

from __future__ import annotations

import base64
import json
import socket

import pytest

from tests.speech.conftest import VOICE_MODEL
from tests.speech.stages import aborted, in_stages, wait_idle
from tests.support.polling import wait_until

pytestmark = pytest.mark.e2e


def test_items_equal_single_requests_and_bad_items_fail_alone(speech_client, speech_http):
    items = [
        {"input": "The batch speaks this first sentence."},
        {"input": "   "},
        {"input": "Too fast for this voice.", "speed": 3.0},
        {"input": "Unknown voice here.", "voice": "nobody"},
        {"input": "The last one is raw samples.", "response_format": "pcm", "seed": 11},
        {"speed": 1.0},
        {"input": "x" * 4097},
        {"input": "A streamed item.", "stream": True},
        {"input": "An unknown model.", "model": "gpt-9"},
    ]
    reply = speech_http.post(
        "/v1/audio/speech/batch",
        json={"model": VOICE_MODEL, "voice": "alloy", "seed": 7, "speed": 1.25, "items": items},
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["id"].startswith("speech-batch-")
    assert (body["total"], body["succeeded"], body["failed"]) == (9, 2, 7)
    results = body["results"]
    assert [r["index"] for r in results] == list(range(9))
    assert [r["status"] for r in results] == ["success"] + ["error"] * 3 + ["success"] + ["error"] * 4
    expected = {
        1: ("input", "Input text cannot be empty"),
        2: ("speed", "[0.5, 2.0]"),
        3: ("voice", "unknown voice 'nobody'"),
        5: ("input", "every item needs an input"),
        6: ("input", "4096"),
        7: ("stream", "not streamed"),
        8: ("model", "gpt-9"),
    }
    for index, (param, text) in expected.items():
        assert results[index]["param"] == param and text in results[index]["error"], results[index]

    # Each success is exactly what /v1/audio/speech says for the merged fields.
    first = speech_client.audio.speech.create(
        model=VOICE_MODEL, input=items[0]["input"], voice="alloy", speed=1.25, extra_body={"seed": 7}
    ).content
    assert results[0]["media_type"] == "audio/wav" and base64.b64decode(results[0]["audio_data"]) == first
    last = speech_client.audio.speech.create(
        model=VOICE_MODEL,
        input=items[4]["input"],
        voice="alloy",
        response_format="pcm",
        speed=1.25,
        extra_body={"seed": 11},
    ).content
    assert results[4]["media_type"] == "audio/pcm" and base64.b64decode(results[4]["audio_data"]) == last
    usage = results[4]["usage"]
    assert (
        usage["input_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    )
    wait_idle(speech_http, VOICE_MODEL)


def test_a_client_that_goes_away_aborts_every_item(speech_server, speech_http):
    long_text = ", ".join(["the quick brown fox jumps over the lazy dog"] * 90)
    body = json.dumps({"model": VOICE_MODEL, "items": [{"input": long_text}, {"input": long_text}]}).encode()
    head = (
        "POST /v1/audio/speech/batch HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    before = aborted(speech_http, VOICE_MODEL)
    with socket.create_connection(("127.0.0.1", speech_server.port)) as sock:
        sock.sendall(head.encode() + body)
        wait_until(lambda: in_stages(speech_http, VOICE_MODEL) >= 1, 60, "the items in the voice stage")
    # The connection closed before any byte of the answer: both items end aborted, none left running.
    wait_until(lambda: aborted(speech_http, VOICE_MODEL) >= before + 2, 60, "both items aborted")
    wait_idle(speech_http, VOICE_MODEL)
