"""Qwen-Image-Edit and Edit-Plus served (one in-process app): an edit of one image, and one of two images
(`image[]`), through the official `openai` client equal the plain pipelines' images; an edit without an
image, a generation from an edit model, or two images for Edit (which edits one) is a 400 naming `image`."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from openai import OpenAI

from omnistage.families.qwen_image_edit.tiny import tiny_qwen_image_edit_dir, tiny_qwen_image_edit_plus_dir
from tests.qwen_image_edit.helpers import SQUARE, WIDE, as_uint8, png, png_pixels, served
from tests.support.speech_family import refused_param

EXTRA = {"num_inference_steps": 2, "negative_prompt": "blurry"}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    models = {"edit": tiny_qwen_image_edit_dir(), "edit-plus": tiny_qwen_image_edit_plus_dir()}
    yield from served(models, tmp_path_factory.mktemp("storage"))


def test_edits_through_the_openai_client_equal_the_plain_pipelines(
    app, edit_references, plus_references
) -> None:
    client = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=app, max_retries=0)
    edited = client.images.edit(
        model="edit",
        image=("square.png", png(SQUARE), "image/png"),
        prompt="make it blue",
        size="64x64",
        extra_body={**EXTRA, "seed": 1},
    )
    assert np.abs(png_pixels(edited.data[0].b64_json) - as_uint8(edit_references["a"])).max() <= 1
    combined = client.images.edit(
        model="edit-plus",
        image=[("square.png", png(SQUARE), "image/png"), ("wide.png", png(WIDE), "image/png")],
        prompt="put the cat beside the fox",
        size="64x64",
        extra_body={**EXTRA, "seed": 5},
    )
    assert np.abs(png_pixels(combined.data[0].b64_json) - as_uint8(plus_references["a"])).max() <= 1


@pytest.mark.parametrize("model", ["edit", "edit-plus"])
def test_an_edit_without_an_image_is_a_400_naming_image(app, model: str) -> None:
    bare = app.post("/v1/images/edits", data={"model": model, "prompt": "make it blue"})
    assert bare.status_code == 400 and bare.json()["error"]["param"] == "image", bare.text
    client = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=app, max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.generate(model=model, prompt="make it blue", size="64x64")
    assert refused_param(refused.value) == "image", refused.value.body


def test_edit_takes_one_image(app) -> None:
    client = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=app, max_retries=0)
    two = [("square.png", png(SQUARE), "image/png"), ("wide.png", png(WIDE), "image/png")]
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.edit(model="edit", image=two, prompt="make it blue", size="64x64")
    assert refused_param(refused.value) == "image" and "one image" in str(refused.value.body)
