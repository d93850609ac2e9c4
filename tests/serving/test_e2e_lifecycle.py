"""Server lifecycle: video jobs across restarts, a dead stage, graceful SIGTERM (own server processes)."""

import os
import signal
import threading
from pathlib import Path

import httpx
import pytest

from omnistage.connectors.shm import live_segments
from tests.support.polling import wait_until
from tests.support.server_process import ServerProcess, toy_server_args
from tests.support.toy_stages import open_gate

pytestmark = pytest.mark.e2e


def wait_status(http: httpx.Client, video_id: str, statuses: set[str]) -> dict:
    def reached():
        job = http.get(f"/v1/videos/{video_id}").json()
        return job if job["status"] in statuses else None

    return wait_until(reached, what=f"video {video_id} in {statuses}")


def test_video_jobs_survive_a_restart(tmp_path):
    storage = tmp_path / "storage"
    args = toy_server_args("toy-video", storage_dir=storage)
    first = ServerProcess(args, tmp_path / "first.log")
    try:
        first.wait_healthy()
        with httpx.Client(base_url=first.url, timeout=30) as http:
            done = http.post(
                "/v1/videos",
                json={"prompt": "done", "size": "8x8", "num_frames": 3, "num_inference_steps": 2},
            ).json()
            wait_status(http, done["id"], {"completed"})
            mp4 = http.get(f"/v1/videos/{done['id']}/content").content
            running = http.post(  # held before its last step (a gate without a gate dir never opens)
                "/v1/videos", json={"prompt": "running HOLD:never", "size": "8x8", "num_inference_steps": 3}
            ).json()
            wait_status(http, running["id"], {"in_progress"})
    finally:
        first.stop(signal.SIGKILL)  # a crash: no chance to record anything

    second = ServerProcess(args, tmp_path / "second.log")
    try:
        second.wait_healthy()
        with httpx.Client(base_url=second.url, timeout=30) as http:
            job = http.get(f"/v1/videos/{done['id']}").json()
            assert job["status"] == "completed" and job["progress"] == 100
            assert http.get(f"/v1/videos/{done['id']}/content").content == mp4
            lost = http.get(f"/v1/videos/{running['id']}").json()
            assert lost["status"] == "failed" and lost["error"]["code"] == "server_restart"
            assert http.get(f"/v1/videos/{running['id']}/content").status_code == 400
            listed = [j["id"] for j in http.get("/v1/videos", params={"order": "asc"}).json()["data"]]
            assert listed == [done["id"], running["id"]]
    finally:
        assert second.stop() == 0


def stage_pids(health: dict) -> list[int]:
    return [r["pid"] for m in health["models"].values() for s in m["stages"] for r in s["replicas"]]


def test_dead_stage_health_and_graceful_sigterm(tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    args = toy_server_args(
        "toy-omni",
        storage_dir=tmp_path / "storage",
        # The vocoder in its own process (the others inline, to keep the test light), left dead when it
        # dies (tests/reliability shows a replica restarting on its own).
        stage_overrides={"2": {"placement": "process", "max_restarts": 0}},
        extra=["--toy-gate-dir", str(gates)],
    )
    server = ServerProcess(args, tmp_path / "server.log")
    chat = {"messages": [{"role": "user", "content": "hi HOLD:drain"}], "max_tokens": 20}
    try:
        server.wait_healthy(timeout=180)
        http = httpx.Client(base_url=server.url, timeout=30)
        pids = stage_pids(http.get("/health").json())
        vocoder = pids[2]
        assert pids[0] == pids[1] == server.proc.pid != vocoder

        os.kill(vocoder, signal.SIGKILL)
        wait_until(lambda: http.get("/health").status_code == 503, what="health 503")
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        speech = http.post("/v1/audio/speech", json={"input": "hi"})
        assert speech.status_code == 503 and "vocoder" in speech.json()["error"]["message"]
        short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert http.post("/v1/chat/completions", json=short).status_code == 200

        results = {}
        worker = threading.Thread(
            target=lambda: results.update(r=http.post("/v1/chat/completions", json=chat))
        )
        worker.start()
        wait_until(lambda: thinker_load(http) == 1, what="the chat request in flight")  # held at its gate
        server.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: draining(server.url), what="the server draining")
        open_gate(gates, "drain")  # only now can it finish: within the grace period, after the signal
        worker.join(30)
        assert results["r"].status_code == 200  # in-flight work finished within the grace period
        assert results["r"].json()["usage"]["completion_tokens"] == 20
        assert server.proc.wait(30) == 0
    finally:
        server.stop()


def draining(url: str) -> bool:
    """Whether the server took the signal: it refuses new work (503) or no longer accepts connections."""
    try:
        return httpx.get(url + "/v1/models", timeout=5).status_code == 503
    except httpx.TransportError:
        return True


def thinker_load(http: httpx.Client) -> int:
    return http.get("/health").json()["models"]["toy-omni"]["stages"][0]["replicas"][0]["load"]


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_to_the_server_group_stops_every_stage_quietly(tmp_path):
    """As a terminal's Ctrl-C or a service manager sends it, the signal reaches the server's whole process
    group. The server drains, stops its stages itself, logs none of them as dead, leaves nothing behind: no
    process, no shared memory segment, no temporary directory (the stages' IPC sockets live in one)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    args = toy_server_args("toy-omni", storage_dir=tmp_path / "storage", extra=["--placement", "process"])
    server = ServerProcess(args, tmp_path / "server.log", env={"TMPDIR": str(scratch)})
    try:
        server.wait_healthy(timeout=180)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            pids = stage_pids(http.get("/health").json())
            speech = http.post("/v1/audio/speech", json={"input": "hello there"})  # audio crosses shm
            assert speech.status_code == 200 and len(speech.content) > 44
        assert len(pids) == 3 and server.proc.pid not in pids and all(_running(p) for p in pids)
        assert server.stop(signal.SIGTERM, group=True) == 0
        logs = server.logs()
        assert "died" not in logs and "ERROR" not in logs, logs
        assert not any(_running(p) for p in pids)
        assert not live_segments(server.proc.pid)
        assert not list(scratch.glob("omnistage-*"))
    finally:
        server.stop(signal.SIGKILL)
