"""WS /v1/audio/speech/stream on the real voice: text sent in pieces comes back sentence by sentence as
speech pocketsphinx understands, each sentence the same audio `/v1/audio/speech` makes of it; bad messages are
error events that end nothing; a client that goes away mid-sentence aborts it in every stage."""

from __future__ import annotations

import io
import json
from contextlib import contextmanager

import numpy as np
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.speech.conftest import VOICE_MODEL
from tests.speech.stages import aborted, in_stages, wait_idle
from tests.support.asr import transcribe, word_errors
from tests.support.polling import wait_until

pytestmark = pytest.mark.e2e
UTTERANCES = [
    [
        "The weather is nice today.",
        "We walked to the park in the morning.",
        "My brother likes to read books.",
    ],
    ["Please open the window.", "The train leaves at noon.", "She bought fresh bread at the market."],
]


@contextmanager
def session(server):
    with connect(server.url.replace("http", "ws") + "/v1/audio/speech/stream", max_size=None) as ws:
        yield ws


def send(ws, kind: str, **fields) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def event(ws) -> dict:
    message = ws.recv(timeout=120)
    assert isinstance(message, str), f"expected an event, got {len(message)} bytes of audio"
    return json.loads(message)


def sentences_of(ws, utterances: int) -> list[list[dict]]:
    """Every sentence of the next `utterances` utterances: its audio.start, audio bytes and audio.done."""
    result: list[list[dict]] = []
    for utterance in range(utterances):
        sentences: list[dict] = []
        while True:
            start = event(ws)
            if start["type"] == "session.done":
                assert start == {
                    "type": "session.done",
                    "utterance_index": utterance,
                    "total_sentences": len(sentences),
                }
                break
            assert start["type"] == "audio.start", start
            assert (start["utterance_index"], start["sentence_index"]) == (utterance, len(sentences))
            chunks = []
            while isinstance(message := ws.recv(timeout=120), bytes):
                chunks.append(message)
            done = json.loads(message)
            assert done == {
                "type": "audio.done",
                "utterance_index": utterance,
                "sentence_index": len(sentences),
                "total_bytes": sum(map(len, chunks)),
                "error": False,
            }
            sentences.append({**start, "chunks": chunks})
        result.append(sentences)
    return result


def pieces(text: str, size: int) -> list[str]:
    """The text cut every `size` characters, mid-word and mid-sentence."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_streamed_text_is_spoken_sentence_by_sentence_intelligibly(speech_server, speech_client):
    with session(speech_server) as ws:
        send(ws, "session.config", model=VOICE_MODEL, voice="nova", response_format="wav", seed=5)
        for utterance in UTTERANCES:
            for piece in pieces(" ".join(utterance), 7):
                send(ws, "input.text", text=piece)
            send(ws, "input.done")
        spoken = sentences_of(ws, len(UTTERANCES))
        send(ws, "session.close")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=60)
        assert closed.value.rcvd.code == 1000
    errors = words = 0
    for utterance, sentences in zip(UTTERANCES, spoken, strict=True):
        assert [s["sentence_text"] for s in sentences] == utterance
        for text, sentence in zip(utterance, sentences, strict=True):
            assert sentence["format"] == "wav" and sentence["sample_rate"] == 24000
            (wav,) = sentence["chunks"]  # a whole file per sentence
            samples, rate = sf.read(io.BytesIO(wav), dtype="float32")
            wrong, total = word_errors(text, transcribe(samples, rate))
            errors, words = errors + wrong, words + total
    assert errors / words <= 0.3, f"word error rate {errors / words:.2f}"
    # A sentence is the speech route's own request: the same bytes for the same fields.
    alone = speech_client.audio.speech.create(
        model=VOICE_MODEL, input=UTTERANCES[1][2], voice="nova", response_format="wav", extra_body={"seed": 5}
    ).content
    assert spoken[1][2]["chunks"] == [alone]


def test_stream_audio_sends_pcm_as_it_is_made(speech_server, speech_client):
    text = "Streaming sends the samples as soon as they exist, clause by clause. Then the next one."
    with session(speech_server) as ws:
        send(ws, "session.config", model=VOICE_MODEL, response_format="pcm", stream_audio=True, seed=9)
        send(ws, "input.text", text=text)
        send(ws, "input.done")
        (sentences,) = sentences_of(ws, 1)
    assert [s["sentence_text"] for s in sentences] == [
        "Streaming sends the samples as soon as they exist, clause by clause.",
        "Then the next one.",
    ]
    for sentence in sentences:
        streamed = np.frombuffer(b"".join(sentence["chunks"]), "<i2").astype(np.int32)
        whole = speech_client.audio.speech.create(
            model=VOICE_MODEL,
            input=sentence["sentence_text"],
            voice="heart",
            response_format="pcm",
            extra_body={"seed": 9},
        ).content
        expected = np.frombuffer(whole, "<i2").astype(np.int32)
        assert len(streamed) == len(expected) and np.abs(streamed - expected).max() <= 1


BAD_CONFIGS = [
    ({"response_format": "mp3", "stream_audio": True}, "response_format"),
    ({"speed": 3.0}, "speed"),
    ({"voice": "nobody"}, "voice"),
    ({"model": "gpt-9"}, "model"),
    ({"sample_rate": 5}, "sample_rate"),
    ({"response_format": "ogg"}, "response_format"),
]


def test_bad_messages_are_error_events_and_the_session_goes_on(speech_server, speech_http):
    def error(ws, param) -> dict:
        got = event(ws)
        assert got["type"] == "error" and got["param"] == param and got["code"] == 400, got
        return got

    with session(speech_server) as ws:
        ws.send("{not json")
        assert "not valid JSON" in error(ws, None)["message"]
        ws.send(b"\x00\x01")
        assert "binary" in error(ws, None)["message"]
        ws.send("[1, 2]")
        error(ws, "type")
        send(ws, "input.text", text="Too early.")
        assert "before session.config" in error(ws, "type")["message"]
        send(ws, "speak.now")
        assert "unknown message type" in error(ws, "type")["message"]
        for fields, param in BAD_CONFIGS:
            send(ws, "session.config", **{"model": VOICE_MODEL, **fields})
            assert error(ws, param)["message"].startswith(param) or param == "model"
        send(ws, "session.config", model=VOICE_MODEL, response_format="pcm")
        send(ws, "input.text", text=7)
        error(ws, "text")
        send(ws, "input.done")
        assert "no text" in error(ws, "text")["message"]
        send(ws, "input.text", text="x" * 4097)
        assert "4096" in error(ws, "text")["message"]
        send(ws, "input.text", text="Still buffered")
        send(ws, "session.config", model=VOICE_MODEL)
        assert "while text is buffered" in error(ws, "type")["message"]
        send(ws, "input.done")
        ((sentence,),) = sentences_of(ws, 1)
        assert sentence["sentence_text"] == "Still buffered" and sentence["format"] == "pcm"
        assert len(b"".join(sentence["chunks"])) > 0
        # A sentence the voice cannot say fails alone: an error event, then its one terminal audio.done.
        send(ws, "input.text", text="ㅋㅋㅋ")  # words, but none the voice can say
        send(ws, "input.done")
        failed = error(ws, "input")
        assert (failed["utterance_index"], failed["sentence_index"]) == (1, 0)
        assert "nothing it can say" in failed["message"]
        done = {
            "type": "audio.done",
            "utterance_index": 1,
            "sentence_index": 0,
            "total_bytes": 0,
            "error": True,
        }
        assert event(ws) == done
        assert event(ws) == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}
    wait_idle(speech_http, VOICE_MODEL)


def test_a_client_that_goes_away_mid_sentence_aborts_it_in_every_stage(speech_server, speech_http):
    long_text = ", ".join(["the quick brown fox jumps over the lazy dog"] * 90)  # one long sentence
    before = aborted(speech_http, VOICE_MODEL)
    with session(speech_server) as ws:
        send(ws, "session.config", model=VOICE_MODEL, response_format="pcm")
        send(ws, "input.text", text=long_text)
        send(ws, "input.done")
        wait_until(lambda: in_stages(speech_http, VOICE_MODEL) >= 1, 60, "the sentence in the voice stage")
    # The socket closed while the voice was speaking: the server aborted the sentence in every stage.
    wait_until(lambda: aborted(speech_http, VOICE_MODEL) > before, 60, "the sentence aborted")
    wait_idle(speech_http, VOICE_MODEL)
