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


def wav(seconds: float, rate: int = 1000) -> bytes:
    import numpy as np
    import soundfile as sf

    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(int(seconds * rate), dtype=np.float32), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def png(side: int) -> bytes:
    """Seeded noise: it does not compress, so the file grows with the side."""
    import numpy as np

    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_upload_and_audio_limits_of_a_toy_family(tmp_path):
    """Upload bytes and input-audio seconds as a family declares them (the toy image pipeline re-declared)."""
    import dataclasses

    from omnistage.config.capabilities import Capabilities, Limits
    from tests.support.toy_pipelines import image_pipeline

    caps = Capabilities(
        routes=("chat", "images"),
        prompt="text",
        fields={"diffusion": (0,)},
        limits=Limits(max_upload_bytes=4000, max_audio_seconds=1.0),
    )
    omni = AsyncOmni(dataclasses.replace(image_pipeline(), capabilities=caps), placement="inline")
    try:
        with TestClient(create_app({"toy": omni}, ServerSettings(storage_dir=tmp_path))) as client:
            small, big = png(8), png(64)
            assert len(small) < 4000 < len(big)
            data = {"model": "toy", "prompt": "redder", "size": "16x16"}
            ok = client.post("/v1/images/edits", data=data, files={"image": ("a.png", small, "image/png")})
            assert ok.status_code == 200, ok.text
            refused = client.post("/v1/images/edits", data=data, files={"image": ("a.png", big, "image/png")})
            assert_refused(refused, "image", "max_upload_bytes of 4000")
            for seconds, status in ((0.5, 200), (1.5, 400)):
                part = {
                    "type": "input_audio",
                    "input_audio": {"data": base64.b64encode(wav(seconds)).decode()},
                }
                body = {"model": "toy", "messages": [{"role": "user", "content": [part]}]}
                response = client.post("/v1/chat/completions", json=body)
                assert response.status_code == status, response.text
            assert_refused(response, "messages[0].content[0].input_audio.data", "max_audio_seconds of 1.0")
    finally:
        omni._close()


def test_max_generated_image_size_flag():
    import argparse

    from omnistage.serving.cli_args import add_server_args

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert parser.parse_args(["--max-generated-image-size", "1024x768"]).max_image_pixels == 1024 * 768
    assert parser.parse_args(["--max-image-pixels", "4096"]).max_image_pixels == 4096
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-generated-image-size", "big"])
