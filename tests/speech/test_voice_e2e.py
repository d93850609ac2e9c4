"""The demo speaks: what the server says is intelligible, streamed speech is the same speech, and the chat
model's spoken answer says what its text says (the real trained voice and chat model, a real server)."""

from __future__ import annotations

import base64
import io
import json
import re

import numpy as np
import pytest
import soundfile

from tests.speech.conftest import CHAT_MODEL, VOICE_MODEL
from tests.speech.stages import aborted, wait_idle
from tests.support.asr import transcribe, word_errors
from tests.support.polling import wait_until

pytestmark = pytest.mark.e2e

SENTENCES = [
    "The weather is nice today.",
    "Please open the door for me.",
    "I would like a cup of coffee.",
    "The train leaves at seven in the morning.",
    "She reads a book every night before bed.",
    "We went to the park and played football.",
    "My brother lives in a small house by the river.",
    "Can you help me carry these boxes?",
    "The children are singing in the garden.",
    "Thank you very much for your kind letter.",
    "It is going to rain this afternoon.",
    "He bought some bread and milk at the store.",
]


def wav_samples(data: bytes) -> tuple[np.ndarray, int]:
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    return samples, rate


def int16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1, 1) * 32767).round().astype(np.int32)


def phonemes_read(text: str) -> int:
    """The phoneme ids (with hibari's two pads a unit) the voice reads for `text`."""
    from omnistage.families.hibari.units import speech_units
    from omnistage.families.hibari.voice import load_hibari

    tts = load_hibari()
    units, _ = speech_units(text, final=True, first=True)
    return sum(len(tts.ids(ps)) for unit in units for ps in tts.phonemize(unit))


def stage_counter(http, model: str, name: str) -> dict[str, float]:
    """`omnistage_stage_requests_started` of one model's stages, by stage name (replicas summed)."""
    counts: dict[str, float] = {}
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            stage = re.search(r'stage_name="([^"]*)"', line).group(1)
            counts[stage] = counts.get(stage, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def test_the_server_speaks_intelligibly(speech_client) -> None:
    errors = total = 0
    for i, sentence in enumerate(SENTENCES):
        data = speech_client.audio.speech.create(
            model=VOICE_MODEL, voice="alloy", input=sentence, response_format="wav", extra_body={"seed": i}
        ).content
        samples, rate = wav_samples(data)
        assert rate == 24000 and samples.ndim == 1 and len(samples) > rate // 2
        e, n = word_errors(sentence, transcribe(samples, rate))
        errors, total = errors + e, total + n
    assert errors / total <= 0.3, f"word error rate {errors}/{total}"


TEXT = (
    "Good morning, my dear friend, how have you been? I would like a cup of coffee. "
    "The station is on your right."
)


def test_streamed_speech_is_the_speech(speech_client, speech_http) -> None:
    whole, rate = wav_samples(
        speech_client.audio.speech.create(
            model=VOICE_MODEL, voice="alloy", input=TEXT, response_format="wav", extra_body={"seed": 5}
        ).content
    )
    # Raw PCM as it is produced, through the official client's streaming response.
    with speech_client.audio.speech.with_streaming_response.create(
        model=VOICE_MODEL,
        voice="alloy",
        input=TEXT,
        response_format="pcm",
        extra_body={"seed": 5, "stream_format": "audio"},
    ) as response:
        chunks = [chunk for chunk in response.iter_bytes() if chunk]
    raw = np.frombuffer(b"".join(chunks), "<i2").astype(np.int32)
    # SSE deltas.
    body = {"model": VOICE_MODEL, "input": TEXT, "response_format": "pcm", "stream": True, "seed": 5}
    deltas, done = [], None
    with speech_http.stream("POST", "/v1/audio/speech", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["type"] == "speech.audio.delta":
                    deltas.append(base64.b64decode(event["audio"]))
                else:
                    done = event
    sse = np.frombuffer(b"".join(deltas), "<i2").astype(np.int32)
    assert done["type"] == "speech.audio.done"
    assert done["usage"]["input_tokens"] == phonemes_read(TEXT)  # what the voice reads, not a placeholder
    assert len(deltas) >= 3  # a first clause and two sentences, each as soon as it is spoken
    expected = int16(whole)
    for streamed in (raw, sse):
        assert streamed.shape == expected.shape
        assert np.abs(streamed - expected).max() <= 1


def test_speed_is_the_voices_own(speech_client, speech_http) -> None:
    def seconds(speed: float) -> float:
        data = speech_client.audio.speech.create(
            model=VOICE_MODEL, voice="alloy", input=SENTENCES[0], speed=speed, extra_body={"seed": 1}
        ).content
        samples, rate = wav_samples(data)
        return len(samples) / rate

    assert seconds(0.6) > seconds(1.0) > seconds(1.8)
    response = speech_http.post("/v1/audio/speech", json={"model": VOICE_MODEL, "input": "hi", "speed": 3.0})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "speed" and "[0.5, 2.0]" in error["message"]


def test_a_spoken_chat_answer_says_its_text(speech_client, speech_http) -> None:
    before = stage_counter(speech_http, CHAT_MODEL, "omnistage_stage_requests_started")
    reply = speech_client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        temperature=0,
        max_tokens=48,
    )
    message = reply.choices[0].message
    assert message.content and message.audio is not None
    assert message.audio.transcript == message.content
    assert message.audio.id and message.audio.expires_at > reply.created
    samples, rate = wav_samples(base64.b64decode(message.audio.data))
    heard = transcribe(samples, rate)
    e, n = word_errors(message.content, heard)
    assert e / n <= 0.35, (message.content, heard)
    # A text-only request never enters the voice stage.
    middle = stage_counter(speech_http, CHAT_MODEL, "omnistage_stage_requests_started")
    text_only = speech_client.chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "Hello!"}], temperature=0, max_tokens=8
    )
    assert text_only.choices[0].message.audio is None
    after = stage_counter(speech_http, CHAT_MODEL, "omnistage_stage_requests_started")
    assert middle["voice"] == before.get("voice", 0) + 1 and after["voice"] == middle["voice"]
    assert after["llm"] == middle["llm"] + 1


def test_spoken_chat_streams_audio_while_the_text_is_written(speech_client) -> None:
    stream = speech_client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "Tell me about the city of Paris in three sentences."}],
        modalities=["text", "audio"],
        audio={"voice": "alloy", "format": "wav"},
        temperature=0,
        max_tokens=96,
        stream=True,
    )
    order, text, audio = [], "", []
    for chunk in stream:
        modality = getattr(chunk, "modality", None) or (chunk.model_extra or {}).get("modality")
        for choice in chunk.choices:
            if choice.delta.content and modality == "audio":
                order.append("audio")
                audio.append(wav_samples(base64.b64decode(choice.delta.content))[0])
            elif choice.delta.content:
                order.append("text")
                text += choice.delta.content
    assert "audio" in order and "text" in order[order.index("audio") :]  # audio came before the text ended
    heard = transcribe(np.concatenate(audio), 24000)
    e, n = word_errors(text, heard)
    assert e / n <= 0.35, (text, heard)


LONG = " ".join(f"Sentence number {i} is here to keep the voice busy for a while." for i in range(40))


def test_a_client_that_leaves_a_speech_stream_aborts_it_in_every_stage(speech_http) -> None:
    before = aborted(speech_http, VOICE_MODEL)
    body = {"model": VOICE_MODEL, "input": LONG, "response_format": "pcm", "stream_format": "audio"}
    with speech_http.stream("POST", "/v1/audio/speech", json=body) as response:
        assert response.status_code == 200
        next(chunk for chunk in response.iter_bytes() if chunk)  # the first sentence has been spoken
    wait_until(lambda: aborted(speech_http, VOICE_MODEL) > before, 60, "the speech request aborted")
    wait_idle(speech_http, VOICE_MODEL)


def test_a_client_that_leaves_a_spoken_answer_aborts_it_in_both_stages(speech_http) -> None:
    before = aborted(speech_http, CHAT_MODEL)
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "wav"},
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    with speech_http.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        next(
            line
            for line in lines
            if line.startswith("data: {") and '"modality":"audio"' in line.replace(" ", "")
        )
    wait_until(lambda: aborted(speech_http, CHAT_MODEL) > before, 60, "the spoken answer aborted")
    wait_idle(speech_http, CHAT_MODEL)
