"""POST /v1/audio/transcriptions and /translations on a real `omnistage serve` of the demo's Whisper
tiny.en, through the official `openai` client: every response format, streaming, every upload format, and
bad input answered 400 naming the field."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import av
import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

from omnistage.bench.wer import corpus_wer
from omnistage.demo.whisper import NAME
from omnistage.serving.media import encode_audio
from tests.support.asr import words
from tests.support.server_process import ServerProcess
from tests.whisper.helpers import RATE, SENTENCES, clip

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(voice_demo_server: ServerProcess) -> ServerProcess:
    """The session's voice demo server (tests/support/voice_demo.py): tiny.en among the speaking models."""
    return voice_demo_server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _wav(index: int = 0) -> bytes:
    return encode_audio(clip(index), RATE, "wav")[0]


def _container(samples: np.ndarray, fmt: str, codec: str, rate: int = 48000) -> bytes:
    """`samples` (16 kHz) encoded by FFmpeg through PyAV, at `rate`."""
    from omnistage.media import resample

    data = resample(samples, RATE, rate).astype(np.float32)
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(data[None, :], format="fltp", layout="mono")
        frame.sample_rate = rate
        for packet in (*stream.encode(frame), *stream.encode(None)):
            out.mux(packet)
    return buf.getvalue()


@pytest.fixture(scope="module")
def reference(client: OpenAI) -> str:
    text = client.audio.transcriptions.create(model=NAME, file=("a.wav", _wav()), response_format="json").text
    assert words(text) == words(SENTENCES[0])
    return text


def test_every_response_format(client: OpenAI, reference: str):
    file = ("a.wav", _wav())
    text = client.audio.transcriptions.create(model=NAME, file=file, response_format="text")
    assert text.strip() == reference
    verbose = client.audio.transcriptions.create(
        model=NAME, file=file, response_format="verbose_json", timestamp_granularities=["segment"]
    )
    assert verbose.text == reference and verbose.language == "en"
    assert verbose.duration == pytest.approx(len(clip(0)) / RATE)
    (segment,) = verbose.segments
    assert (
        segment.text == reference and segment.start == 0.0 and segment.end == pytest.approx(verbose.duration)
    )
    assert segment.avg_logprob < 0 and segment.tokens
    srt = client.audio.transcriptions.create(model=NAME, file=file, response_format="srt")
    assert srt.splitlines()[:3] == ["1", f"00:00:00,000 --> {_clock(verbose.duration, ',')}", reference]
    vtt = client.audio.transcriptions.create(model=NAME, file=file, response_format="vtt")
    assert vtt.splitlines()[:3] == ["WEBVTT", "", f"00:00:00.000 --> {_clock(verbose.duration, '.')}"]
    assert vtt.splitlines()[3] == reference


def test_the_served_deployment_transcribes_hibari_speech_with_low_word_error_rate(client: OpenAI):
    """The demo as served (whisper.yaml: the encoder in bf16 where the CPU computes it natively, else float32;
    test_family checks the float32 path token for token against transformers)."""
    heard = [
        client.audio.transcriptions.create(model=NAME, file=("s.wav", _wav(i))).text
        for i in range(len(SENTENCES))
    ]
    assert corpus_wer(SENTENCES, heard) <= 0.2, heard


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    return f"00:00:{ms // 1000:02d}{sep}{ms % 1000:03d}"


def test_stream_deltas_join_into_the_done_text(client: OpenAI, reference: str):
    events = list(client.audio.transcriptions.create(model=NAME, file=("a.wav", _wav()), stream=True))
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) >= 3  # streamed as the decoder writes, not in one piece
    assert events[-1].type == "transcript.text.done"
    assert "".join(deltas) == events[-1].text == reference
    assert [e.type for e in events].count("transcript.text.done") == 1


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("a.flac", lambda s: encode_audio(s, RATE, "flac")[0]),
        ("a.mp3", lambda s: encode_audio(s, RATE, "mp3")[0]),
        ("a.ogg", lambda s: encode_audio(s, RATE, "opus")[0]),  # Ogg Opus
        ("a.webm", lambda s: _container(s, "webm", "libopus")),
        ("a.m4a", lambda s: _container(s, "mp4", "aac")),
    ],
)
def test_upload_formats_transcribe_alike(client: OpenAI, name, make):
    text = client.audio.transcriptions.create(model=NAME, file=(name, make(clip(1))), response_format="text")
    assert words(text) == words(SENTENCES[1].replace(";", "."))


def _error(http: httpx.Client, path: str = "/v1/audio/transcriptions", file: bytes | None = None, **fields):
    files = {"file": ("a.wav", _wav() if file is None else file)}
    r = http.post(path, data={"model": NAME, **fields}, files=files)
    return r.status_code, r.json()["error"]


def test_bad_input_is_400_naming_the_field(http: httpx.Client):
    assert _error(http, response_format="mp4")[1]["param"] == "response_format"
    assert _error(http, file=b"not audio at all" * 10)[1]["param"] == "file"
    assert _error(http, temperature="2")[1]["param"] == "temperature"
    assert _error(http, language="fr")[1]["param"] == "language"
    status, error = _error(http, **{"timestamp_granularities[]": "word", "response_format": "verbose_json"})
    assert (status, error["param"]) == (400, "timestamp_granularities[]")
    assert _error(http, colour="blue")[1]["param"] == "colour"
    assert _error(http, stream="true", response_format="srt")[1]["param"] == "stream"


def test_translation_on_an_english_only_model_is_a_clear_400(client: OpenAI):
    with pytest.raises(openai.BadRequestError) as info:
        client.audio.translations.create(model=NAME, file=("a.wav", _wav()))
    body = info.value.body
    assert body["param"] == "model" and "translations" in body["message"], json.dumps(body)
