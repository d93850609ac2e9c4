"""GLM-Image served by `omnistage serve` (AR and DiT stages as processes): `/v1/images/generations` through
the official `openai` client renders what one `GlmImagePipeline` call renders for the size, steps and seed
(greedy AR tokens through `stage_params`); `n` images share one AR draw; chat answers with the image; a
streamed chat reports the DiT's steps as progress before the image; fields GLM-Image cannot honour are 400s
naming them."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI
from PIL import Image

from omnistage.families.glm_image.tiny import tiny_glm_image_dir
from tests.glm_image.test_glm_image import PROMPTS, picture, reference_edit, reference_image
from tests.support import speech_family

pytestmark = pytest.mark.engine

dirs, server, http, client = speech_family.module_fixtures(tiny_glm_image_dir, "glm-image")
GREEDY = {"stage_params": [{"top_k": 1}, {}], "num_inference_steps": 3, "seed": 7}


def model() -> str:
    return tiny_glm_image_dir().name


def images_of(reply) -> list[np.ndarray]:
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(d.b64_json))).convert("RGB")) for d in reply.data
    ]


def test_generations_render_the_reference_image(client: OpenAI) -> None:
    text = PROMPTS[0][0]
    reply = client.images.generate(model=model(), prompt=text, size="64x64", n=2, extra_body=GREEDY)
    got = images_of(reply)
    want = (reference_image(text, 64, num_images_per_prompt=2) * 255).round().astype(int)
    assert len(got) == 2 and got[0].shape == (64, 64, 3)
    for image, expected in zip(got, want, strict=True):
        assert np.abs(image.astype(int) - expected).max() <= 1
    assert not np.array_equal(got[0], got[1])  # two latents, one AR draw


def test_chat_answers_with_the_image_and_streams_progress(client: OpenAI, http) -> None:
    text = PROMPTS[1][0]
    body = {"model": model(), "messages": [{"role": "user", "content": text}], "modalities": ["image"]}
    reply = client.chat.completions.create(
        model=body["model"], messages=body["messages"], extra_body={"modalities": ["image"], **GREEDY}
    )
    parts = reply.choices[0].message.content
    assert isinstance(parts, list) and parts[0]["type"] == "image_url", parts
    image = np.asarray(
        Image.open(io.BytesIO(base64.b64decode(parts[0]["image_url"]["url"].split(",", 1)[1])))
    )
    want = (reference_image(text, 32)[0] * 255).round().astype(int)
    assert np.abs(image[..., :3].astype(int) - want).max() <= 1
    events = []
    with http.stream("POST", "/v1/chat/completions", json={**body, **GREEDY, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    progress = [(i, e["progress"]) for i, e in enumerate(events) if e.get("progress")]
    assert [(p["step"], p["total"]) for _, p in progress] == [(1, 3), (2, 3), (3, 3)], events
    shown = [
        i
        for i, e in enumerate(events)
        if e["modality"] == "image"
        and str(e["choices"][0]["delta"].get("content")).startswith("data:image/png")
    ]
    assert len(shown) == 1 and shown[0] > progress[-1][0], events


def test_edits_render_the_reference_edit(client: OpenAI) -> None:
    """`images.edit` through the official client: the source image read by the AR model and attended by
    the DiT, equal to the pipeline editing it (the route's size defaults to the image's)."""
    buffer = io.BytesIO()
    picture(3).save(buffer, format="PNG")
    reply = client.images.edit(
        model=model(),
        image=("source.png", buffer.getvalue(), "image/png"),
        prompt="make it blue",
        extra_body=GREEDY,
    )
    got = images_of(reply)[0]
    want = (reference_edit("make it blue", 64, picture(3))[0] * 255).round().astype(int)
    assert got.shape == (64, 64, 3) and np.abs(got.astype(int) - want).max() <= 1


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"size": "48x48"}, "size"),
        ({"extra_body": {"negative_prompt": "blurry"}}, "negative_prompt"),
        ({"extra_body": {"true_cfg_scale": 4.0}}, "true_cfg_scale"),
    ],
)
def test_fields_glm_image_cannot_honour_are_400(client: OpenAI, extra: dict, param: str) -> None:
    fields = {"model": model(), "prompt": PROMPTS[0][0], "size": "32x32", **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.generate(**fields)
    assert refused.value.status_code == 400 and speech_family.refused_param(refused.value) == param


def test_more_bad_inputs_are_400(client: OpenAI, http) -> None:
    """A size past GLM-Image's limit and an edit without an image (options it does not take: above)."""
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.generate(model=model(), prompt=PROMPTS[0][0], size="4096x2048")
    assert speech_family.refused_param(refused.value) == "size", refused.value.body
    reply = http.post("/v1/images/edits", data={"model": model(), "prompt": "make it blue"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "image", reply.text


def test_leaving_mid_render_frees_both_stages(http, server) -> None:
    """A client that leaves while the AR model writes (a raw socket closed), or while the DiT denoises (a
    stream dropped after its first progress), aborts the request: both stages let it go."""
    import socket

    from tests.speech.stages import aborted, metric, wait_idle
    from tests.support.polling import wait_until

    def holding(stage: str) -> bool:
        return metric(http, "omnistage_stage_requests", model=model(), stage_name=stage) == 1

    before = aborted(http, model())
    body = json.dumps({"model": model(), "prompt": PROMPTS[0][0], "size": "1024x1024", **GREEDY}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        head = f"POST /v1/images/generations HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: holding("ar"), 60, "the AR model writing its tokens")
    wait_idle(http, model())
    assert aborted(http, model()) == before + 1
    messages = [{"role": "user", "content": PROMPTS[0][0]}]
    chat = {"model": model(), "messages": messages, "modalities": ["image"], "stream": True, **GREEDY}
    chat["num_inference_steps"] = 200
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=chat, timeout=120) as reply:
        lines = reply.iter_lines()  # kept: a dropped iterator would close the stream
        assert any('"progress"' in line for line in lines)
        wait_until(lambda: holding("dit"), 60, "the DiT denoising")
    wait_idle(http, model())
    assert aborted(http, model()) == before + 2
