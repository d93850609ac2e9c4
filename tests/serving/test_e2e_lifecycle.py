"""Server lifecycle: video jobs across restarts, a dead stage, graceful SIGTERM (own server processes)."""

import os
import signal
import threading
import time

import httpx
import pytest

from tests.serving.server_process import ServerProcess, toy_server_args

pytestmark = pytest.mark.e2e


def wait_status(http: httpx.Client, video_id: str, statuses: set[str], timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = http.get(f"/v1/videos/{video_id}").json()
        if job["status"] in statuses:
            return job
        time.sleep(0.05)
    raise TimeoutError(job)


def test_video_jobs_survive_a_restart(tmp_path):
    storage = tmp_path / "storage"
    args = toy_server_args(
        "toy-video", storage_dir=storage, stage_overrides={"0": {"engine_args": {"step_delay": 0.02}}}
    )
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
            running = http.post(
                "/v1/videos", json={"prompt": "running", "size": "8x8", "num_inference_steps": 200}
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
            assert http.get(f"/v1/videos/{running['id']}/content").status_code == 422
            listed = [j["id"] for j in http.get("/v1/videos", params={"order": "asc"}).json()["data"]]
            assert listed == [done["id"], running["id"]]
    finally:
        assert second.stop() == 0


def stage_pids(health: dict) -> list[int]:
    return [r["pid"] for m in health["models"].values() for s in m["stages"] for r in s["replicas"]]


def test_dead_stage_health_and_graceful_sigterm(tmp_path):
    args = toy_server_args(
        "toy-omni",
        storage_dir=tmp_path / "storage",
        # The vocoder in its own process (the others inline, to keep the test light).
        stage_overrides={"2": {"placement": "process"}},
        extra=["--toy-step-delay", "0.05"],
    )
    server = ServerProcess(args, tmp_path / "server.log")
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 25}
    try:
        server.wait_healthy(timeout=180)
        http = httpx.Client(base_url=server.url, timeout=30)
        pids = stage_pids(http.get("/health").json())
        vocoder = pids[2]
        assert pids[0] == pids[1] == server.proc.pid != vocoder

        os.kill(vocoder, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while http.get("/health").status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        health = http.get("/health")
        assert health.status_code == 503 and health.json()["status"] == "unhealthy"
        speech = http.post("/v1/audio/speech", json={"input": "hi"})
        assert speech.status_code == 503 and "vocoder" in speech.json()["error"]["message"]
        assert http.post("/v1/chat/completions", json={**chat, "max_tokens": 2}).status_code == 200

        results = {}
        worker = threading.Thread(
            target=lambda: results.update(r=http.post("/v1/chat/completions", json=chat))
        )
        worker.start()
        time.sleep(0.5)  # the request is in flight
        server.proc.send_signal(signal.SIGTERM)
        worker.join(30)
        assert results["r"].status_code == 200  # in-flight work finished within the grace period
        assert results["r"].json()["usage"]["completion_tokens"] == 25
        assert server.proc.wait(30) == 0
    finally:
        server.stop()
