"""Per-model limits on the real demo model (wan-shapes, 32x32): a request past one is a 400 naming the limit,
answered before any work starts; the global `--max-generated-image-size` cap lowers them further."""

from __future__ import annotations

import base64
import io

import pytest
from fastapi.testclient import TestClient
from PIL import Image

from omnistage.api import AsyncOmni
from omnistage.demo.model import demo_model_dir
from omnistage.serving.app import create_app
from omnistage.serving.settings import ServerSettings

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    omni = AsyncOmni(demo_model_dir(), placement="inline")
    try:
        yield omni
    finally:
        omni._close()


@pytest.fixture(scope="module")
def client(demo, tmp_path_factory):
    settings = ServerSettings(storage_dir=tmp_path_factory.mktemp("storage"))
    with TestClient(create_app({"wan-shapes": demo}, settings)) as client:
        yield client


def assert_refused(response, param: str, *words: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "BadRequestError"
    for word in words:
        assert word in error["message"], error["message"]


def requests_started(demo) -> list[int]:
    """How many requests each stage has been given so far."""
    stats = demo.orchestrator.run(demo.orchestrator.call("stats")).result()
    return [s["result"]["requests_started"] for s in stats]


def test_1024_is_refused_at_once_naming_the_limit(client, demo):
    before = requests_started(demo)
    response = client.post(
        "/v1/images/generations", json={"model": "wan-shapes", "prompt": "a red circle", "size": "1024x1024"}
    )
    assert_refused(response, "size", "width 1024", "max_width of 64")
    response = client.post(
        "/v1/videos", json={"model": "wan-shapes", "prompt": "a red circle", "size": "1024x1024"}
    )
    assert_refused(response, "size", "max_width of 64")
    assert client.get("/v1/videos").json()["data"] == []  # no job was created
    body = {"model": "wan-shapes", "prompt": "a red circle", "num_inference_steps": 500}
    assert_refused(client.post("/v1/images/generations", json=body), "num_inference_steps", "200")
    body = {"model": "wan-shapes", "prompt": "a red circle", "num_inference_steps": 150}
    assert_refused(
        client.post("/v1/images/generations", json=body), "num_inference_steps", "max_steps of 100"
    )
    body = {"model": "wan-shapes", "prompt": "a red circle", "num_frames": 101}
    assert_refused(client.post("/v1/videos", json=body), "num_frames", "max_frames of 36")
    body = {"model": "wan-shapes", "prompt": "x", "stage_params": [{"width": 512, "height": 512}]}
    assert_refused(client.post("/v1/images/generations", json=body), "stage_params[0].width", "max_width")
    chat = {"model": "wan-shapes", "messages": [{"role": "user", "content": "a circle"}], "size": "96x96"}
    assert_refused(client.post("/v1/chat/completions", json=chat), "size", "max_width of 64")
    assert requests_started(demo) == before  # nothing reached a stage


def test_the_native_size_and_the_margin_are_served(client):
    for size in ("32x32", "48x48"):
        body = {"model": "wan-shapes", "prompt": "a red circle", "size": size, "num_inference_steps": 2}
        response = client.post("/v1/images/generations", json=body)
        assert response.status_code == 200, response.text
        image = Image.open(io.BytesIO(base64.b64decode(response.json()["data"][0]["b64_json"])))
        assert image.size == tuple(int(side) for side in size.split("x"))


def test_the_global_cap_lowers_the_model_limit(demo, tmp_path):
    settings = ServerSettings(storage_dir=tmp_path, max_image_pixels=40 * 40)
    with TestClient(create_app({"wan-shapes": demo}, settings)) as client:
        body = {"model": "wan-shapes", "prompt": "a red circle", "size": "48x48"}
        assert_refused(client.post("/v1/images/generations", json=body), "size", "max_pixels of 1600")
