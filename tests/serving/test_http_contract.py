"""The HTTP contract that holds before any model is involved: auth, body limits, the error envelope,
schema errors naming the field, unknown models and routes, /version, /metrics, the OpenAPI document."""

import pytest
from fastapi.testclient import TestClient

from omnistage import __version__
from omnistage.serving.app import create_app
from omnistage.serving.settings import ServerSettings

pytestmark = pytest.mark.unit
KEY = {"Authorization": "Bearer sekret"}
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = ServerSettings(
        api_key="sekret", max_request_bytes=4096, storage_dir=tmp_path_factory.mktemp("s")
    )
    with TestClient(create_app({}, settings)) as client:
        yield client


def assert_error(response, status: int, param=None, contains: str = ""):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["code"] == status and error["param"] == param
    assert contains in error["message"]
    return error


def test_api_key_protects_everything_but_health(client):
    assert client.get("/health").status_code == 200
    for method, path in [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/metrics"),
        ("GET", "/version"),
    ]:
        response = client.request(method, path)
        assert_error(response, 401, contains="API key")
        assert response.headers["www-authenticate"] == "Bearer"
    assert_error(client.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
    assert client.get("/v1/models", headers=KEY).json() == {"object": "list", "data": []}


def test_body_over_the_limit_is_413_declared_or_chunked(client):
    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    assert_error(
        client.post("/v1/chat/completions", json=big, headers=KEY), 413, contains="limit of 4096 bytes"
    )

    def chunks():
        for _ in range(10):
            yield b"x" * 1000

    response = client.post(
        "/v1/chat/completions", content=chunks(), headers={**KEY, "content-type": "application/json"}
    )
    assert_error(response, 413, contains="exceeds the limit of 4096 bytes")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {**CHAT, "temperature": 5}, "temperature"),
        ("/v1/chat/completions", {**CHAT, "n": 0}, "n"),
        ("/v1/chat/completions", {**CHAT, "modalities": ["smell"]}, "modalities[0]"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": [1, -5]}, "prompt[1]"),
        ("/v1/audio/speech", {"input": "x", "response_format": "ogg"}, "response_format"),
        ("/v1/audio/speech", {"input": "x", "speed": 9}, "speed"),
        ("/v1/audio/speech", {"input": "x", "stream": True, "response_format": "mp3"}, "response_format"),
        ("/v1/audio/speech", {"input": "x", "speed": 0.1}, "speed"),  # streaming speeds are the model's
        ("/v1/images/generations", {"prompt": "x", "size": "big"}, "size"),
        ("/v1/images/generations", {"prompt": "x", "n": 11}, "n"),
        ("/v1/videos", {"prompt": "x", "seconds": "0"}, "seconds"),
        ("/v1/videos", {"prompt": "x", "num_inference_steps": 0}, "num_inference_steps"),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
        (
            "/v1/chat/completions",
            {**CHAT, "stream_options": {"include_usage": "x"}},
            "stream_options.include_usage",
        ),
        ("/v1/completions", {"max_tokens": 4}, "prompt"),
        ("/v1/audio/speech", {"input": "x", "sample_rate": 100}, "sample_rate"),
        ("/v1/images/generations", {"prompt": "x", "output_compression": 101}, "output_compression"),
        ("/v1/videos", {"prompt": "x", "fps": 0}, "fps"),
        ("/v1/audio/speech/batch", {"items": []}, "items"),
        ("/v1/audio/speech/batch", {"items": [{"input": "x"}] * 33}, "items"),
        ("/v1/audio/speech/batch", {"items": [{"input": "x"}], "speed": 9}, "speed"),
        ("/v1/audio/speech/batch", {"items": [{"input": "x"}], "response_format": "ogg"}, "response_format"),
        ("/v1/audio/generate", {"input": "x", "response_format": "ogg"}, "response_format"),
        ("/v1/audio/generate", {"input": "x", "audio_length": 0}, "audio_length"),
        ("/v1/audio/generate", {"input": "x", "num_inference_steps": 0}, "num_inference_steps"),
        ("/v1/audio/generate", {"audio_length": 1}, "input"),
    ],
)
def test_schema_errors_are_400_naming_the_field(client, path, body, param):
    error = assert_error(client.post(path, json=body, headers=KEY), 400, param=param)
    assert error["message"].startswith(param)


def test_multipart_schema_errors_name_the_field(client):
    files = {"image": ("a.png", b"png bytes", "image/png")}
    response = client.post("/v1/images/edits", files=files, data={"prompt": "p", "n": "many"}, headers=KEY)
    assert_error(response, 400, param="n")
    assert_error(
        client.post("/v1/videos", data={"prompt": "p", "size": "12"}, headers=KEY), 400, param="size"
    )
    assert_error(
        client.post("/v1/images/edits", json={"prompt": "p"}, headers=KEY), 400, contains="multipart"
    )


def test_voice_upload_form_errors_name_the_field(client):
    wav = {"audio_sample": ("v.wav", b"RIFF....WAVE", "audio/wav")}
    form = {"name": "my_voice", "consent": "yes"}
    assert_error(client.post("/v1/audio/voices", files=wav, data={"name": "a"}, headers=KEY), 400, "consent")
    bad_name = {**form, "name": "../etc"}
    assert_error(client.post("/v1/audio/voices", files=wav, data=bad_name, headers=KEY), 400, "name")
    assert_error(client.post("/v1/audio/voices", data=form, headers=KEY), 400, "audio_sample", "required")
    # A file that is not audio: refused by the decoders, nothing stored.
    response = client.post("/v1/audio/voices", files=wav, data=form, headers=KEY)
    assert_error(response, 400, "audio_sample", "not a decodable audio file")
    listed = client.get("/v1/audio/voices", headers=KEY).json()
    assert listed == {"voices": [], "uploaded_voices": [], "models": []}
    assert_error(client.delete("/v1/audio/voices/nobody", headers=KEY), 404, "name", "not found")
    assert_error(client.get("/v1/audio/voices?model=gpt-9", headers=KEY), 404, "model")


def test_speech_routes_without_a_speaking_model_are_400(client):
    batch = client.post("/v1/audio/speech/batch", json={"items": [{"input": "hi"}]}, headers=KEY)
    assert batch.status_code == 200  # per-item errors, never the whole batch
    assert batch.json()["failed"] == 1 and batch.json()["results"][0]["param"] == "model"
    generate = client.post("/v1/audio/generate", json={"input": "rain"}, headers=KEY)
    assert_error(generate, 400, "model", "no served model")


def test_query_errors_are_400_and_no_422_is_documented(client):
    assert_error(client.get("/v1/videos?limit=0", headers=KEY), 400, param="limit")
    assert_error(client.get("/v1/videos?order=sideways", headers=KEY), 400, param="order")
    document = client.get("/openapi.json", headers=KEY).json()
    for item in document["paths"].values():
        for operation in item.values():
            assert "422" not in operation["responses"]
    assert document["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]


def test_invalid_json_is_400(client):
    response = client.post(
        "/v1/chat/completions", content=b"{bad", headers={**KEY, "content-type": "application/json"}
    )
    assert_error(response, 400, contains="not valid JSON")
    response = client.post("/v1/videos", content=b"[1]", headers={**KEY, "content-type": "application/json"})
    assert_error(response, 400, contains="expected a JSON object")


def test_unknown_model_route_and_job_are_404(client):
    assert_error(
        client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"}, headers=KEY),
        404,
        "model",
        "gpt-9",
    )
    assert_error(client.get("/v1/models/gpt-9", headers=KEY), 404, "model")
    assert_error(client.get("/v1/nothing", headers=KEY), 404, contains="no route GET /v1/nothing")
    assert_error(client.get("/v1/videos/video_x", headers=KEY), 404, "video_id")
    assert_error(client.delete("/v1/videos/video_x", headers=KEY), 404, "video_id")
    assert_error(client.get("/v1/videos/video_x/content", headers=KEY), 404, "video_id")


def test_logprob_rules(client):
    body = {**CHAT, "top_logprobs": 2}
    assert_error(
        client.post("/v1/chat/completions", json=body, headers=KEY), 400, "top_logprobs", "needs logprobs"
    )
    body = {**CHAT, "logprobs": True, "top_logprobs": 21}
    assert_error(client.post("/v1/chat/completions", json=body, headers=KEY), 400, "top_logprobs", "20")
    body = {"prompt": "x", "logprobs": 2}
    assert_error(client.post("/v1/completions", json=body, headers=KEY), 400, "logprobs", "not supported")


def test_no_model_for_the_route_is_400(client):
    assert_error(client.post("/v1/chat/completions", json=CHAT, headers=KEY), 400, "model", "no served model")


def test_version_metrics_and_openapi(client):
    assert client.get("/version", headers=KEY).json() == {"version": __version__}
    client.get("/health")
    text = client.get("/metrics", headers=KEY).text
    assert 'omnistage_http_requests_total{method="GET",route="/health",status="200"}' in text
    assert "omnistage_http_request_duration_seconds_bucket" in text
    paths = client.get("/openapi.json", headers=KEY).json()["paths"]
    for path in [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/audio/speech",
        "/v1/audio/speech/batch",
        "/v1/audio/voices",
        "/v1/audio/voices/{name}",
        "/v1/audio/generate",
        "/v1/images/generations",
        "/v1/images/edits",
        "/v1/videos",
        "/v1/videos/{video_id}",
        "/v1/videos/{video_id}/content",
        "/v1/models",
        "/health",
        "/metrics",
        "/version",
    ]:
        assert path in paths
    edit_body = paths["/v1/images/edits"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert edit_body["properties"]["image"]["items"]["format"] == "binary"
    assert set(paths["/v1/videos"]["post"]["requestBody"]["content"]) == {
        "application/json",
        "multipart/form-data",
    }


def test_an_app_removes_the_directories_it_made_for_itself_when_it_stops(tmp_path):
    """Without --storage-dir / --voices-dir an app keeps video jobs and uploaded voices in temporary
    directories: they go when it stops. Directories it was given stay."""
    app = create_app({})
    ctx = app.state.omnistage
    made = [ctx.videos.root.parent, ctx.voices.store.root]
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        assert all(path.is_dir() for path in made)
    assert not any(path.exists() for path in made)

    given = ServerSettings(storage_dir=tmp_path / "storage", voices_dir=tmp_path / "voices")
    app = create_app({}, given)
    with TestClient(app):
        pass
    assert (tmp_path / "storage").is_dir() and (tmp_path / "voices").is_dir()
