"""Janus-Pro's image generation: the LM on the AR engine with its unconditional twin writes the image tokens
`JanusForConditionalGeneration.generate(generation_mode="image")` writes (greedy: `top_k: 1` here, argmax
there; the checkpoint's guidance 5) for 4 prompts, alone and 4 batched arriving at different steps; the
pipeline (offline API, both stages) renders the reference's image from them."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.families.janus.decoder import image_prompt
from omnistage.families.janus.pipeline import JanusRender, to_rgb
from omnistage.families.janus.tiny import tiny_janus_dir
from omnistage.params import SamplingParams
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.guidance import Guidance
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run

pytestmark = pytest.mark.engine

PROMPTS = ["a red fox in the snow", "a bowl of fruit", "the moon over a quiet lake", "a small robot painting"]
LM = {
    "model_loader": "omnistage.families.janus.decoder:load_janus",
    "post_sample_hook": "omnistage.families.janus.decoder:janus_image_embeds",
}


@functools.cache
def reference_model():
    from transformers import JanusForConditionalGeneration

    return JanusForConditionalGeneration.from_pretrained(str(tiny_janus_dir())).eval()


def reference_tokens(ids: list[int]) -> list[int]:
    """`generate` in image mode, greedy, its checkpoint's guidance (transformers 5.25 drops the saved
    `generation_kwargs`: the image-start id set again, as its users must)."""
    model = reference_model()
    model.generation_config.generation_kwargs = {"boi_token_id": ids[-1]}
    prompt = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), generation_mode="image", do_sample=False
        )
    return out[0].tolist()


def request(engine, rid: str, text: str) -> StageRequest:
    loaded = engine.input_resources()
    ids, unconditional = image_prompt(loaded.tokenizer, loaded.ids, text)
    tokens = loaded.num_image_tokens
    params = SamplingParams(top_k=1, max_tokens=tokens, min_tokens=tokens, ignore_eos=True, detokenize=False)
    inputs = ARInputs(guidance=Guidance(loaded.guidance_scale, prompt_token_ids=unconditional))
    return StageRequest(rid, prompt=ids, params=params, inputs=inputs)


def test_image_tokens_equal_reference_alone_and_batched() -> None:
    engine = make_engine(model_dir=str(tiny_janus_dir()), engine_args=LM)
    requests = [request(engine, f"r{i}", p) for i, p in enumerate(PROMPTS)]
    expected = [reference_tokens(r.prompt) for r in requests]
    assert len({tuple(e) for e in expected}) >= 3 and sum(len(set(e)) > 2 for e in expected) >= 2
    for i, text in enumerate(PROMPTS):
        results, _ = run(engine, [request(engine, f"alone{i}", text)])
        assert results[f"alone{i}"].token_ids == expected[i], i
    results, _ = run(engine, requests, [0, 1, 3, 5])
    for i in range(len(PROMPTS)):
        assert results[f"r{i}"].token_ids == expected[i], i
    stats = engine.stats()
    assert stats["peak_running"] > 2 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_the_pipeline_renders_the_reference_image() -> None:
    from transformers import JanusImageProcessorPil

    from omnistage import Omni

    model_dir = str(tiny_janus_dir())
    with Omni(model_dir, "omnistage/families/janus/janus_inline.yaml") as omni:
        engine = make_engine(model_dir=model_dir, engine_args=LM)
        ids = request(engine, "x", PROMPTS[0]).prompt
        out = omni.generate(PROMPTS[0], [SamplingParams(top_k=1), None], ["image"], use_tqdm=False)[0]
    assert out.error is None, out.error
    tokens = torch.tensor([reference_tokens(ids)])
    with torch.inference_mode():
        pixels = reference_model().decode_image_tokens(tokens)
    want = to_rgb(pixels, JanusImageProcessorPil.from_pretrained(model_dir))[0].numpy()
    got = np.asarray(out.images[0])
    assert got.shape == want.shape == (32, 32, 3) and np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert want.std() > 0
    # before 8-bit rounding: the render stage's pixels are the reference's
    render = JanusRender(model_dir, "cpu")
    assert (render.pixels(tokens) - pixels).abs().max() < 1e-4


def photo(seed: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def reference_answer(text: str, images: list[Image.Image], max_new_tokens: int = 12) -> list[int]:
    """`generate` in text mode (greedy) on the processor's chat turn with the images."""
    from transformers import JanusProcessor

    processor = JanusProcessor.from_pretrained(str(tiny_janus_dir()))
    content = [*({"type": "image"} for _ in images), {"type": "text", "text": text}]
    prompt = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    inputs = processor(text=prompt, images=images or None, return_tensors="pt")
    with torch.inference_mode():
        out = reference_model().generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def test_chat_with_images_answers_the_reference_text() -> None:
    """Understanding (chat's default answer, text): a question about one image, about two, and text alone,
    greedy, through both stages' pipeline (only the LM runs)."""
    from omnistage import Omni
    from omnistage.prompts import ChatPrompt

    cases = [
        ("what is in this picture?", [photo(1)]),
        ("what is in this picture?", [photo(5)]),
        ("compare them", [photo(2), photo(3)]),
        ("hello", []),
    ]
    answers = [reference_answer(text, images) for text, images in cases]
    assert len({tuple(a) for a in answers}) == 4 and all(len(set(a)) > 3 for a in answers)
    with Omni(str(tiny_janus_dir()), "omnistage/families/janus/janus_inline.yaml") as omni:
        for (text, images), want in zip(cases, answers, strict=True):
            content = [*({"type": "image"} for _ in images), {"type": "text", "text": text}]
            prompt = ChatPrompt(messages=[{"role": "user", "content": content}], images=images)
            out = omni.generate(prompt, [SamplingParams(temperature=0, max_tokens=12), None], use_tqdm=False)[
                0
            ]
            assert out.error is None, out.error
            assert out.token_ids == want[: len(out.token_ids)] and len(out.token_ids) == len(want), text
            assert out.text and not out.images
