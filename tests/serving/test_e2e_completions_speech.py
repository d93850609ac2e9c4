"""Completions and text-to-speech through the official openai client against a real server process."""

import base64
import io
import json

import numpy as np
import pytest
import soundfile as sf

from omnistage.params import SamplingParams
from omnistage.serving import media

pytestmark = pytest.mark.e2e
SPEECH_PROMPT = {"messages": [{"role": "user", "content": "read this aloud"}], "speaker": "alloy"}


def test_completion_equals_offline_generation(client, reference):
    reply = client.completions.create(model="toy-omni", prompt="once upon", max_tokens=5)
    expected = reference.run("toy-omni", "once upon", SamplingParams(max_tokens=5), ["text"])
    assert reply.choices[0].text == expected.text and reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert reply.usage.completion_tokens == 5


def test_completion_stream_batch_echo_and_token_prompts(client, reference):
    stream = client.completions.create(model="toy-omni", prompt="once upon", max_tokens=5, stream=True)
    expected = reference.run("toy-omni", "once upon", SamplingParams(max_tokens=5), ["text"])
    assert "".join(c.choices[0].text for c in stream) == expected.text

    batch = client.completions.create(model="toy-omni", prompt=["a", "b"], max_tokens=2, n=2, echo=True)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert all(c.text.startswith("a") for c in batch.choices[:2])
    assert all(c.text.startswith("b") for c in batch.choices[2:])

    tokens = client.completions.create(model="toy-omni", prompt=[5, 6, 7], max_tokens=3)
    assert tokens.choices[0].text == reference.run("toy-omni", [5, 6, 7], SamplingParams(max_tokens=3)).text


def expected_pcm(reference, max_tokens=None) -> tuple[np.ndarray, int]:
    """Without max_new_tokens the route asks for the whole answer (max_tokens None: up to the context)."""
    params = SamplingParams(max_tokens=max_tokens)
    out = reference.run("toy-omni", SPEECH_PROMPT, params, ["audio"])
    return (out.audio.numpy().clip(-1, 1) * 32767).round().astype(np.int16), out.sample_rate


@pytest.mark.parametrize(
    ("fmt", "content_type"),
    [
        ("wav", "audio/wav"),
        ("flac", "audio/flac"),
        ("pcm", "audio/pcm"),
        ("mp3", "audio/mpeg"),
        ("opus", "audio/opus"),
    ],
)
def test_speech_in_every_format(client, reference, fmt, content_type):
    response = client.audio.speech.with_raw_response.create(
        model="toy-omni", input="read this aloud", voice="alloy", response_format=fmt
    )
    assert response.headers["content-type"] == content_type
    assert int(response.headers["x-omnistage-input-tokens"]) > 0
    for name in ("input-tokens", "output-tokens", "total-tokens", "input-text-tokens", "input-audio-tokens"):
        # vLLM-Omni's names for the same usage, as its clients read them
        assert response.headers[f"x-vllm-omni-{name}"] == response.headers[f"x-omnistage-{name}"]
    data = response.http_response.content
    want, rate = expected_pcm(reference)
    if fmt == "pcm":
        np.testing.assert_array_equal(np.frombuffer(data, "<i2"), want)
        return
    samples, decoded_rate = sf.read(io.BytesIO(data), dtype="int16")
    if fmt in ("wav", "flac"):
        assert decoded_rate == rate
        np.testing.assert_array_equal(samples, want)
    else:  # lossy: decodes to exactly what encoding the reference samples here decodes to
        assert decoded_rate == rate and abs(len(samples) - len(want)) < 0.03 * rate
        local, _ = media.encode_audio(want.astype(np.float32) / 32767, rate, fmt)
        np.testing.assert_array_equal(samples, sf.read(io.BytesIO(local), dtype="int16")[0])


def test_speech_resample_and_speed(client, reference):
    want, rate = expected_pcm(reference)
    data = client.audio.speech.create(
        model="toy-omni",
        input="read this aloud",
        voice="alloy",
        response_format="wav",
        extra_body={"sample_rate": 8000},
    ).content
    samples, decoded_rate = sf.read(io.BytesIO(data), dtype="int16")
    assert decoded_rate == 8000 and abs(len(samples) - len(want) / 2) <= 32
    fast = client.audio.speech.create(
        model="toy-omni", input="read this aloud", voice="alloy", response_format="wav", speed=2.0
    ).content
    assert abs(len(sf.read(io.BytesIO(fast))[0]) - len(want) / 2) < 0.05 * rate


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
def test_speech_raw_audio_stream(client, reference, fmt):
    want, rate = expected_pcm(reference)
    with client.audio.speech.with_streaming_response.create(
        model="toy-omni",
        input="read this aloud",
        voice="alloy",
        response_format=fmt,
        extra_body={"stream_format": "audio"},
    ) as response:
        pieces = list(response.iter_bytes())
    data = b"".join(pieces)
    if fmt == "wav":
        assert data[:4] == b"RIFF" and data[36:40] == b"data"
        assert int.from_bytes(data[24:28], "little") == rate
        data = data[44:]
    np.testing.assert_array_equal(np.frombuffer(data, "<i2"), want)


def test_speech_sse_events(http, reference):
    body = {
        "model": "toy-omni",
        "input": "read this aloud",
        "voice": "alloy",
        "response_format": "pcm",
        "stream": True,
    }
    with http.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    names = [e.split(": ", 1)[1] for e in events if e.startswith("event:")]
    payloads = [json.loads(e.split(": ", 1)[1]) for e in events if e.startswith("data:")]
    assert names[-1] == "speech.audio.done" and set(names[:-1]) == {"speech.audio.delta"} and len(names) >= 3
    pcm = b"".join(base64.b64decode(p["audio"]) for p in payloads[:-1])
    want, _ = expected_pcm(reference)
    np.testing.assert_array_equal(np.frombuffer(pcm, "<i2"), want)
    usage = payloads[-1]["usage"]
    assert usage["input_tokens"] == usage["input_token_details"]["text_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_speech_errors(http):
    cases = [
        ({"input": "x", "stream": True, "response_format": "mp3"}, 400, "response_format"),
        ({"input": "x", "stream_format": "sse", "speed": 1.5}, 400, "speed"),
        ({"input": "   "}, 400, "input"),
        ({"input": "x", "model": "toy-image"}, 400, "model"),
        ({"input": "x", "model": "nope"}, 404, "model"),
    ]
    for body, status, param in cases:
        response = http.post("/v1/audio/speech", json=body)
        assert response.status_code == status, (body, response.text)
        assert response.json()["error"]["param"] == param
