"""A stage process killed (SIGKILL) in the middle of a stream fails only the requests it held: the client
gets one terminal error, requests on other models go on, and the stage is started again on its own and
serves the next request."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import pytest

from tests.reliability.conftest import (
    CHAT,
    SHAPES,
    VOICE,
    replicas,
    wait_all_free,
    wait_serving,
)
from tests.support.polling import wait_until

pytestmark = pytest.mark.e2e
LONG_TEXT = " ".join(
    f"This is sentence number {k} of a long passage, spoken one clause at a time." for k in range(30)
)


def sse_events(response: httpx.Response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def bound_replica(url: str, model: str, stage: int) -> tuple[tuple[str, int, int], int]:
    """The replica of `model`'s stage that holds a request now, and its pid."""

    def busy():
        found = [(k, r["pid"]) for k, r in replicas(url).items() if k[:2] == (model, stage) and r["load"]]
        return found[0] if found else None

    return wait_until(busy, 60, f"a request on {model} stage {stage}")


def other_model_works(url: str, results: dict) -> threading.Thread:
    """A request on another model, in flight while the stage dies: it must not notice."""

    def run() -> None:
        body = {"model": VOICE, "input": "Another model, unaffected.", "response_format": "wav"}
        results["other"] = httpx.post(url + "/v1/audio/speech", json=body, timeout=120)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_spoken_chat_survives_its_llm_stage_dying_mid_stream(demo_server):
    url = demo_server.url
    body = {
        "model": CHAT,
        "stream": True,
        "max_tokens": 2000,
        "ignore_eos": True,
        "temperature": 0,
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "pcm16"},
        "messages": [{"role": "user", "content": "Tell me a very long story about a lighthouse."}],
    }
    results: dict = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = sse_events(response)
        next(events)  # streaming: the request is in the stages now
        key, pid = bound_replica(url, CHAT, 0)
        other = other_model_works(url, results)
        os.kill(pid, signal.SIGKILL)
        rest = list(events)
    errors = [e for e in rest if "error" in e]
    assert len(errors) == 1 and "stage 0 (llm)" in errors[0]["error"]["message"], rest[-3:]
    other.join(120)
    assert results["other"].status_code == 200 and len(results["other"].content) > 44
    new_pid = wait_serving(url, key, pid)
    assert new_pid != pid
    again = httpx.post(
        url + "/v1/chat/completions", json={**body, "stream": False, "max_tokens": 8}, timeout=120
    )
    assert again.status_code == 200 and again.json()["choices"][0]["message"]["audio"]["data"]
    wait_all_free(url, "after the restart")


def test_speech_survives_its_voice_replica_dying_mid_stream(demo_server):
    url = demo_server.url
    body = {"model": VOICE, "input": LONG_TEXT, "stream": True, "response_format": "pcm"}
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = sse_events(response)
        first = next(events)
        assert first["type"] == "speech.audio.delta"
        key, pid = bound_replica(url, VOICE, 0)
        chat = httpx.post(
            url + "/v1/chat/completions",
            json={"model": CHAT, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            timeout=120,
        )
        os.kill(pid, signal.SIGKILL)
        rest = list(events)
    assert chat.status_code == 200
    assert [e["type"] for e in rest][-1] == "speech.audio.error", rest[-2:]
    assert sum(e["type"] in ("speech.audio.done", "speech.audio.error") for e in rest) == 1
    wait_serving(url, key, pid)
    again = httpx.post(url + "/v1/audio/speech", json={"model": VOICE, "input": "Back again."}, timeout=120)
    assert again.status_code == 200 and again.content[:4] == b"RIFF"
    wait_all_free(url, "after the restart")


def test_a_video_job_fails_with_a_reason_when_its_stage_dies_and_the_next_one_completes(demo_server, http):
    url = demo_server.url
    job = http.post(
        "/v1/videos",
        json={"model": SHAPES, "prompt": "a red circle moves right", "num_inference_steps": 100, "seed": 1},
    ).json()

    def stepping():
        state = http.get(f"/v1/videos/{job['id']}").json()
        return state["progress"] > 0 and state["status"] == "in_progress"

    wait_until(stepping, 120, "the job stepping")
    key, pid = bound_replica(url, SHAPES, 1)
    os.kill(pid, signal.SIGKILL)
    failed = wait_until(
        lambda: (s := http.get(f"/v1/videos/{job['id']}").json())["status"] in ("failed", "completed") and s,
        120,
        "the job ended",
    )
    assert failed["status"] == "failed" and "stage 1 (video)" in failed["error"]["message"], failed
    wait_serving(url, key, pid)
    done = http.post(
        "/v1/videos", json={"model": SHAPES, "prompt": "a blue square", "num_inference_steps": 4}
    )
    ended = wait_until(
        lambda: (
            (s := http.get(f"/v1/videos/{done.json()['id']}").json())["status"] in ("failed", "completed")
            and s
        ),
        120,
        "the second job ended",
    )
    assert ended["status"] == "completed", ended
    assert http.get(f"/v1/videos/{done.json()['id']}/content").content[4:8] == b"ftyp"
    wait_all_free(url, "after the restart")
