"""What the served codec-TTS families' tests share (tests/csm, tests/dia, tests/higgs_audio_v2): a server on
a voices directory, the 400's `param`, and a client that leaves mid-stream."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.polling import wait_until
from tests.support.server_process import ServerProcess


def start(model_dir: Path, voices: Path, log: Path) -> ServerProcess:
    """`omnistage serve model_dir` (its default deploy, one thread a stage) with its voices in `voices`."""
    args = ["serve", str(model_dir), "--num-threads", "1", "--voices-dir", str(voices)]
    proc = ServerProcess(args, log, module="omnistage")
    proc.wait_healthy(timeout=300)
    return proc


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
