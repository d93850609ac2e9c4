"""What the served TTS families' tests share (tests/csm, tests/dia, tests/higgs_audio_v2, tests/voxcpm2,
tests/vibevoice; tests/janus its server fixtures): a server on a voices directory, the 400's `param`, a
client that leaves mid-stream, and the checks every route and an uploaded voice pass (`Speaker`)."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import soundfile

from tests.support.polling import wait_until
from tests.support.server_process import ServerProcess


def start(model_dir: Path, voices: Path, log: Path) -> ServerProcess:
    """`omnistage serve model_dir` (its default deploy, one thread a stage) with its voices in `voices`."""
    args = ["serve", str(model_dir), "--num-threads", "1", "--voices-dir", str(voices)]
    proc = ServerProcess(args, log, module="omnistage")
    proc.wait_healthy(timeout=300)
    return proc


def module_fixtures(model_dir: Callable[[], Path], name: str) -> tuple:
    """The module-scoped fixtures of a served family's tests, to assign to the module's names `dirs, server,
    http, client`: a voices directory and a log directory, the server on them, and its HTTP and `openai`
    clients."""
    from openai import OpenAI

    @pytest.fixture(scope="module")
    def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
        return tmp_path_factory.mktemp(f"{name}-voices"), tmp_path_factory.mktemp(f"{name}-server")

    @pytest.fixture(scope="module")
    def server(dirs: tuple[Path, Path]) -> Iterator[ServerProcess]:
        proc = start(model_dir(), dirs[0], dirs[1] / "server.log")
        try:
            yield proc
        finally:
            proc.stop()

    @pytest.fixture(scope="module")
    def http(server: ServerProcess) -> Iterator[httpx.Client]:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            yield client

    @pytest.fixture(scope="module")
    def client(server: ServerProcess) -> Any:
        return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    return dirs, server, http, client


def refused_param(error) -> str | None:
    """The `param` of an `openai.BadRequestError`'s OpenAI error body."""
    body = error.body if isinstance(error.body, dict) else {}
    return body.get("error", body).get("param")


def leave_mid_stream(
    http: httpx.Client, server: ServerProcess, model: str, body: dict, stages: tuple
) -> None:
    """Stream `body` (endless), leave once the codec has spoken while both `stages` hold the request, and
    check the request was aborted in both and the stages went idle."""
    from tests.speech.stages import aborted, metric, wait_idle

    def held(stage_name: str) -> float:
        return metric(http, "omnistage_stage_requests", model=model, stage_name=stage_name)

    before = aborted(http, model)
    with (
        httpx.Client(base_url=server.url, timeout=120) as own,
        own.stream("POST", "/v1/audio/speech", json=body) as reply,
    ):
        lines = reply.iter_lines()  # kept alive: dropping the iterator closes the connection
        assert any('"speech.audio.delta"' in line for line in lines)  # the codec has spoken
        wait_until(lambda: all(held(s) == 1 for s in stages), 120, "both stages holding it")
    wait_idle(http, model)
    assert aborted(http, model) == before + 1


@dataclasses.dataclass
class Speaker:
    """One served model spoken to through the official client: `speak` (PCM bytes) with the test's
    deterministic `params` (stage_params), its `text` and output `rate`."""

    client: Any  # openai.OpenAI
    model: str
    text: str
    params: list[dict]
    rate: int

    def speak(self, text: str | None = None, **extra: Any) -> bytes:
        voice = extra.pop("voice", "default")
        reply = self.client.audio.speech.create(
            model=self.model,
            voice=voice,
            input=self.text if text is None else text,
            response_format="pcm",
            extra_body={"stage_params": self.params, **extra},
        )
        return reply.content

    def wav(self, samples: Any, rate: int | None = None) -> bytes:
        out = io.BytesIO()
        soundfile.write(out, samples, rate or self.rate, format="WAV", subtype="FLOAT")
        return out.getvalue()

    def every_route_speaks_the_same_audio(
        self, http: httpx.Client, server: ServerProcess, other_text: str, orphan: dict
    ) -> None:
        """Speech, its SSE stream (async chunks, joined) and raw stream, the batch (one good item, an empty
        input and `orphan`, an item whose field lacks its pair) and the streaming-text WebSocket: the same
        audio, and other text other audio."""
        whole = self.speak()
        assert len(whole) > 0 and self.speak(other_text) != whole
        deltas, done = [], None
        stream = self.client.audio.speech.with_streaming_response
        common = {"model": self.model, "voice": "default", "input": self.text, "response_format": "pcm"}
        with stream.create(**common, extra_body={"stage_params": self.params, "stream": True}) as reply:
            for line in reply.iter_lines():
                if line.startswith("data:"):
                    data = json.loads(line[5:])
                    if data["type"] == "speech.audio.delta":
                        deltas.append(base64.b64decode(data["audio"]))
                    else:
                        done = data
        assert done is not None and done["type"] == "speech.audio.done", done
        assert len(deltas) >= 2 and b"".join(deltas) == whole  # async chunks, joined: the same audio
        with stream.create(
            **common, extra_body={"stage_params": self.params, "stream_format": "audio"}
        ) as reply:
            assert b"".join(reply.iter_bytes()) == whole

        fields = {"voice": "default", "stage_params": self.params, "response_format": "pcm"}
        items = [{"input": self.text}, {"input": "  "}, {"input": self.text, **orphan}]
        batch = http.post("/v1/audio/speech/batch", json={"model": self.model, **fields, "items": items})
        assert batch.status_code == 200, batch.text
        results = batch.json()["results"]
        assert [r["status"] for r in results] == ["success", "error", "error"]
        assert base64.b64decode(results[0]["audio_data"]) == whole
        assert results[1]["param"] == "input" and results[2]["param"] == next(iter(orphan))

        from websockets.sync.client import connect

        with connect(server.url.replace("http", "ws") + "/v1/audio/speech/stream", max_size=None) as ws:
            ws.send(json.dumps({"type": "session.config", "model": self.model, **fields}))
            ws.send(json.dumps({"type": "input.text", "text": self.text}))
            ws.send(json.dumps({"type": "input.done"}))
            start_event = json.loads(ws.recv(timeout=120))
            assert start_event["type"] == "audio.start" and start_event["sample_rate"] == self.rate
            chunks = []
            while isinstance(message := ws.recv(timeout=120), bytes):
                chunks.append(message)
            assert json.loads(message)["type"] == "audio.done"
        assert b"".join(chunks) == whole

    def an_uploaded_voice_is_its_clip(self, http: httpx.Client, clip: bytes, ref_text: str | None) -> None:
        """A voice uploaded as "teller" with its transcript (if the family takes one) speaks as the same clip
        given inline (and not as the default voice); the model lists its one built-in voice and that it
        clones."""
        text = {} if ref_text is None else {"ref_text": ref_text}
        got = http.post(
            "/v1/audio/voices",
            data={"name": "teller", "consent": "yes", **text},
            files={"audio_sample": ("teller.wav", clip, "audio/wav")},
        )
        assert got.status_code == 200, got.text
        uploaded = self.speak(voice="teller")
        inline = self.speak(ref_audio="data:audio/wav;base64," + base64.b64encode(clip).decode(), **text)
        assert uploaded == inline != self.speak()
        entry = http.get("/v1/audio/voices", params={"model": self.model}).json()["models"][0]
        assert entry["voices"] == ["default"] and entry["clones_voices"] is True
