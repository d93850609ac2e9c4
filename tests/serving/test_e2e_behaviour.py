"""Server behaviour under real conditions: overload, disconnects, auth, routing between models, metrics."""

import concurrent.futures
import json
import socket

import httpx
import openai
import pytest

from tests.serving.conftest import API_KEY
from tests.support.polling import wait_until
from tests.support.toy_stages import open_gate

pytestmark = pytest.mark.e2e
# held before its last step at a gate never opened: in flight until the test ends it
HELD_IMAGE = {"model": "toy-image", "prompt": "x HOLD:never", "size": "8x8", "num_inference_steps": 3}


def metric(http, name: str, **labels) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total, found = 0.0, False
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    assert found, f"no {name} sample with {labels}"
    return total


def wait_until_idle(http, model: str) -> None:
    """Until every stage of `model` holds no request."""
    wait_until(lambda: in_stages(http, model) == 0, what=f"{model} idle")


def in_stages(http, model: str) -> float:
    return metric(http, "omnistage_stage_requests", model=model)


def test_full_admission_queue_is_429_with_retry_after(server, http, gates):
    def post(prompt):
        return httpx.post(
            server.url + "/v1/images/generations",
            json={**HELD_IMAGE, "prompt": prompt},
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
        )

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        held = [pool.submit(post, "x HOLD:admission") for _ in range(6)]
        wait_until(lambda: in_stages(http, "toy-image") == 6, what="six requests in flight")
        rejected = post("x")  # the seventh finds the queue (--max-queued-requests 6) full
        open_gate(gates, "admission")
        codes = [f.result().status_code for f in held]
    assert codes == [200] * 6
    assert rejected.status_code == 429 and rejected.headers["retry-after"] == "1"
    assert rejected.json()["error"]["type"] == "RateLimitError"


def test_video_jobs_are_refused_with_429_when_admission_is_full(server, http):
    body = {
        "model": "toy-video",
        "prompt": "x HOLD:never",
        "size": "8x8",
        "num_frames": 2,
        "num_inference_steps": 3,
    }
    created = [http.post("/v1/videos", json=body) for _ in range(7)]
    assert [r.status_code for r in created] == [200] * 6 + [429]  # the seventh finds 6 in flight
    assert created[-1].headers["retry-after"] == "1"
    for response in created[:6]:
        http.delete(f"/v1/videos/{response.json()['id']}")


def aborted_count(http) -> float:
    """toy-image requests that ended with finish_reason abort (0 before the first one)."""
    if 'finish_reason="abort",model="toy-image"' not in http.get("/metrics").text:
        return 0.0
    return metric(http, "omnistage_requests_finished_total", model="toy-image", finish_reason="abort")


def test_client_disconnect_aborts_a_streaming_request(server, http):
    aborted_before = aborted_count(http)
    body = {
        "model": "toy-image",
        "messages": [{"role": "user", "content": "x HOLD:never"}],
        "size": "8x8",
        "num_inference_steps": 3,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with (
        httpx.Client(base_url=server.url, headers=headers, timeout=30) as own,
        own.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()  # kept alive: dropping the iterator closes the connection
        assert next(lines).startswith("data: ")
        assert metric(http, "omnistage_stage_requests", model="toy-image") == 1
    # leaving the block closed the connection mid-stream
    wait_until_idle(http, "toy-image")
    assert aborted_count(http) == aborted_before + 1


def test_client_disconnect_aborts_a_plain_request(server, http):
    aborted_before = aborted_count(http)
    body = json.dumps(HELD_IMAGE).encode()
    head = (
        f"POST /v1/images/generations HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(head.encode() + body)
        wait_until(lambda: in_stages(http, "toy-image") == 1, what="the request running")
    # the connection closed while the request was running, before any byte of the answer
    wait_until_idle(http, "toy-image")
    assert aborted_count(http) == aborted_before + 1


def test_oversized_bodies_are_413_before_being_read(http):
    big = b'{"prompt": "' + b"x" * (3 * 1024 * 1024) + b'"}'
    response = http.post("/v1/completions", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == 413
    assert "limit of 2097152 bytes" in response.json()["error"]["message"]


def test_api_key_is_required(server):
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(server.url + "/health").status_code == 200  # the one public route


def test_models_are_routed_by_name_or_by_what_the_route_needs(client, http):
    listed = {m.id: m.model_extra["modalities"] for m in client.models.list().data}
    assert listed == {
        "toy-omni": ["text", "audio"],
        "toy-image": ["image"],
        "toy-video": ["video"],
        "tiny-flux1": ["image"],
        "tiny-wan21-t2v": ["video"],
        "tiny-stable-audio": ["audio"],
    }
    assert client.models.retrieve("toy-video").id == "toy-video"
    # No model: the first served model that can answer the route.
    assert http.post("/v1/images/generations", json={"prompt": "x", "size": "8x8"}).status_code == 200
    assert http.post("/v1/audio/speech", json={"input": "hi"}).headers["content-type"] == "audio/wav"
    chat = http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    )
    assert chat.json()["model"] == "toy-omni"
    video_chat = client.chat.completions.create(
        model="toy-video",
        messages=[{"role": "user", "content": "sea"}],
        extra_body={"size": "8x8", "num_frames": 2},
    )
    assert video_chat.choices[0].message.content[0]["video_url"]["url"].startswith("data:video/mp4;base64,")
    with pytest.raises(openai.NotFoundError, match="gpt-4o"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    wrong = http.post(
        "/v1/chat/completions",
        json={"model": "toy-image", "messages": [{"role": "user", "content": "hi"}], "modalities": ["audio"]},
    )
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "model"


def test_metrics_report_routes_latency_ttft_ttfa_and_stages(client, http):
    client.chat.completions.create(
        model="toy-omni", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    client.audio.speech.create(model="toy-omni", input="hi", voice="a")
    assert metric(http, "omnistage_http_requests_total", route="/v1/chat/completions", status="200") >= 1
    assert metric(http, "omnistage_http_request_duration_seconds_count", route="/v1/audio/speech") >= 1
    assert metric(http, "omnistage_time_to_first_token_seconds_count", model="toy-omni") >= 1
    assert metric(http, "omnistage_time_to_first_audio_seconds_count", model="toy-omni") >= 1
    assert metric(http, "omnistage_stage_requests", model="toy-omni", stage="2", stage_name="vocoder") == 0
    assert metric(http, "omnistage_stage_alive", model="toy-omni") == 3
    assert metric(http, "omnistage_requests_in_flight", model="toy-omni") == 0
    health = http.get("/health").json()
    assert health["status"] == "healthy" and set(health["models"]) == set(listed_models(http))


def listed_models(http) -> list[str]:
    return [m["id"] for m in http.get("/v1/models").json()["data"]]
