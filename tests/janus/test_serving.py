"""Janus-Pro served by `omnistage serve` (both stages as processes): `/v1/images/generations` through the
official `openai` client renders the reference's image (greedy tokens through `stage_params`), a seed picks
the sampled image (the same seed, the same image); fields Janus cannot honour are 400s naming them."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import openai
import pytest
import torch
from openai import OpenAI
from PIL import Image

from omnistage.families.janus.decoder import image_prompt, marker_ids
from omnistage.families.janus.pipeline import to_rgb
from omnistage.families.janus.tiny import tiny_janus_dir
from tests.janus.test_janus import PROMPTS, reference_model, reference_tokens
from tests.support import speech_family

pytestmark = pytest.mark.engine

dirs, server, http, client = speech_family.module_fixtures(tiny_janus_dir, "janus")
GREEDY = {"stage_params": [{"top_k": 1}, {}]}


def model() -> str:
    return tiny_janus_dir().name


def render(client: OpenAI, **extra) -> np.ndarray:
    reply = client.images.generate(model=model(), prompt=PROMPTS[0], size="32x32", extra_body=extra)
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(reply.data[0].b64_json))).convert("RGB"))


def test_generations_render_the_reference_image(client: OpenAI) -> None:
    from transformers import AutoTokenizer, JanusImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_janus_dir()))
    ids, _ = image_prompt(tokenizer, marker_ids(tokenizer, reference_model().generation_config), PROMPTS[0])
    with torch.inference_mode():
        pixels = reference_model().decode_image_tokens(torch.tensor([reference_tokens(ids)]))
    want = to_rgb(pixels, JanusImageProcessorPil.from_pretrained(str(tiny_janus_dir())))[0].numpy()
    got = render(client, **GREEDY)
    assert got.shape == (32, 32, 3) and np.abs(got.astype(int) - want.astype(int)).max() <= 1
    seeded = render(client, seed=3)
    assert np.array_equal(seeded, render(client, seed=3)) and not np.array_equal(
        seeded, render(client, seed=4)
    )


def test_chat_answers_with_the_image(client: OpenAI) -> None:
    """Chat on a text-to-image model answers with the image as an `image_url` content part (vLLM-Omni's
    shape): the same image the images route renders."""
    reply = client.chat.completions.create(
        model=model(),
        messages=[{"role": "user", "content": PROMPTS[0]}],
        extra_body={"modalities": ["image"], **GREEDY},
    )
    parts = reply.choices[0].message.content
    assert isinstance(parts, list) and parts[0]["type"] == "image_url", parts
    url = parts[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    image = np.asarray(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB"))
    assert np.array_equal(image, render(client, **GREEDY))


def images_of(reply) -> list[np.ndarray]:
    return [
        np.asarray(Image.open(io.BytesIO(base64.b64decode(d.b64_json))).convert("RGB")) for d in reply.data
    ]


def test_n_images_a_request(client: OpenAI) -> None:
    """`n`: that many images, each its own sequence beside its twin: greedy, all the single greedy image;
    sampled with a seed, two different images."""
    fields = {"model": model(), "prompt": PROMPTS[0], "size": "32x32"}
    images = images_of(client.images.generate(**fields, n=3, extra_body=GREEDY))
    assert len(images) == 3 and all(np.array_equal(render(client, **GREEDY), i) for i in images)
    two = images_of(client.images.generate(**fields, n=2, extra_body={"seed": 3}))
    assert len(two) == 2 and not np.array_equal(two[0], two[1])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"size": "64x64"}, "size"),
        ({"n": 5}, "n"),
        ({"extra_body": {"num_inference_steps": 4}}, "num_inference_steps"),
        ({"extra_body": {"guidance_scale": 0.5}}, "guidance_scale"),
        ({"extra_body": {"negative_prompt": "blurry"}}, "negative_prompt"),
    ],
)
def test_fields_janus_cannot_honour_are_400(client: OpenAI, extra: dict, param: str) -> None:
    fields = {"model": model(), "prompt": PROMPTS[0], "size": "32x32", **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.images.generate(**fields)
    assert refused.value.status_code == 400 and speech_family.refused_param(refused.value) == param


def test_chat_about_an_image_answers_the_reference_text(client: OpenAI) -> None:
    """Understanding through the official client: an `image_url` part and a question, greedy; the answer is
    the text `generate` (text mode) writes for the same turn."""
    from transformers import AutoTokenizer

    from tests.janus.test_janus import photo, reference_answer

    buffer = io.BytesIO()
    photo(1).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    question = "what is in this picture?"
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]
    reply = client.chat.completions.create(
        model=model(), messages=[{"role": "user", "content": content}], temperature=0, max_tokens=12
    )
    want = reference_answer(question, [photo(1)])
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_janus_dir()))
    assert reply.choices[0].message.content == tokenizer.decode(want, skip_special_tokens=True)
    assert reply.usage.completion_tokens == len(want)


def test_a_text_answer_ends_at_the_lms_eos_unless_the_request_ignores_it(client: OpenAI) -> None:
    """The LM's EOS ends a text answer (a stop token: Janus's engine EOS is none, as images have no end
    marker); `ignore_eos` writes past it to `max_tokens`, as on every other model."""
    asked = {"model": model(), "messages": [{"role": "user", "content": "tell me a long story"}]}
    plain = client.chat.completions.create(**asked, max_tokens=1000, seed=3)  # a seed whose answer ends
    ended = plain.usage.completion_tokens
    assert plain.choices[0].finish_reason == "stop" and ended < 1000
    ignored = client.chat.completions.create(
        **asked, max_tokens=ended + 20, seed=3, extra_body={"ignore_eos": True}
    )
    assert ignored.choices[0].finish_reason == "length" and ignored.usage.completion_tokens == ended + 20
    assert ignored.choices[0].message.content.startswith(plain.choices[0].message.content)


def test_an_edit_is_refused_and_leaving_an_answer_frees_the_stages(http, server) -> None:
    """Janus does not edit (with or without an image: 400s naming `image`); a client that drops a streamed
    answer aborts it, and no stage holds it after."""
    from tests.speech.stages import aborted, metric, wait_idle
    from tests.support.polling import wait_until

    fields = {"model": model(), "prompt": "make it blue"}
    bare = http.post("/v1/images/edits", data=fields)
    png = io.BytesIO()
    Image.new("RGB", (32, 32)).save(png, format="PNG")
    edit = http.post("/v1/images/edits", data=fields, files={"image": ("a.png", png.getvalue(), "image/png")})
    for reply in (bare, edit):
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "image", reply.text
    before = aborted(http, model())
    body = {
        "model": model(),
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "stream": True,
        "max_tokens": 3000,
        "ignore_eos": True,
    }
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as reply:
        lines = reply.iter_lines()  # kept: a dropped iterator would close the stream
        next(line for line in lines if line.startswith("data: "))
        wait_until(
            lambda: metric(http, "omnistage_stage_requests", model=model(), stage_name="lm") == 1, 60, "lm"
        )
    wait_idle(http, model())
    assert aborted(http, model()) == before + 1
