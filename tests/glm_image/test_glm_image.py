"""GLM-Image: the AR model on the AR engine writes the tokens `GlmImageForConditionalGeneration.generate`
writes for `GlmImagePipeline.generate_prior_tokens`' prompt (its checkpoint samples top-1: greedy) for 4
prompts at 3 sizes, alone and 4 batched arriving at different steps; the DiT, step by step on the diffusion
engine, renders what the pipeline renders from the same prior tokens (alone, and batched with prompts of
other glyph lengths); the whole pipeline (offline API, both stages) equals one `GlmImagePipeline` call."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from omnistage.families.glm_image.decoder import image_prompt
from omnistage.families.glm_image.tiny import tiny_glm_image_dir
from omnistage.params import DiffusionParams, SamplingParams
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run

pytestmark = pytest.mark.engine

# prompt, height, width: square and tall targets (preview grids 16x16 and 22x11), glyph texts of 0-2 quotes
PROMPTS = [
    ("a red fox in the snow", 64, 64),
    ("a sign that says 'open'", 32, 32),
    ("the moon over a quiet lake", 64, 32),
    ("a cup, a \"pen\" and a 'book'", 64, 64),
]
AR = {"model_loader": "omnistage.families.glm_image.decoder:load_glm_image"}


@functools.cache
def reference_pipeline():
    from diffusers import GlmImagePipeline

    pipe = GlmImagePipeline.from_pretrained(str(tiny_glm_image_dir()), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def reference_tokens(text: str, height: int, width: int, count: int) -> list[int]:
    """What `generate_prior_tokens` generates: `generate` on the processor's prompt, sampling (top-1 and
    the suppressed ids past the codebook: the checkpoint's generation config)."""
    pipe = reference_pipeline()
    messages = [[{"role": "user", "content": [{"type": "text", "text": text}]}]]
    inputs = pipe.processor.apply_chat_template(
        messages, tokenize=True, target_h=height, target_w=width, return_dict=True, return_tensors="pt"
    )
    torch.manual_seed(0)
    with torch.inference_mode():
        out = pipe.vision_language_encoder.generate(**inputs, max_new_tokens=count + 1, do_sample=True)
    return out[0, inputs["input_ids"].shape[1] :].tolist()[:count]


def request(engine, rid: str, text: str, height: int, width: int) -> StageRequest:
    prompt = image_prompt(engine.input_resources(), text, height, width)
    n = prompt.num_tokens
    params = SamplingParams(top_k=1, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
    return StageRequest(
        rid, prompt=prompt.token_ids, params=params, inputs=ARInputs(position_ids=prompt.positions)
    )


def test_image_tokens_equal_reference_alone_and_batched() -> None:
    engine = make_engine(model_dir=str(tiny_glm_image_dir()), engine_args=AR)
    requests = [request(engine, f"r{i}", *p) for i, p in enumerate(PROMPTS)]
    expected = [reference_tokens(*p, r.params.max_tokens) for p, r in zip(PROMPTS, requests, strict=True)]
    assert [len(e) for e in expected] == [260, 257, 244, 260]
    assert len({tuple(e) for e in expected}) == 4 and all(len(set(e)) > 12 for e in expected)
    for i, p in enumerate(PROMPTS):
        results, _ = run(engine, [request(engine, f"alone{i}", *p)])
        assert results[f"alone{i}"].token_ids == expected[i], i
    results, _ = run(engine, requests, [0, 1, 3, 5])
    for i in range(len(PROMPTS)):
        assert results[f"r{i}"].token_ids == expected[i], i
    stats = engine.stats()
    assert stats["peak_running"] > 2 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


def reference_image(text: str, size: int, prior: torch.Tensor | None = None, **kwargs) -> np.ndarray:
    pipe = reference_pipeline()
    out = pipe(
        text,
        height=size,
        width=size,
        num_inference_steps=3,
        generator=torch.Generator().manual_seed(7),
        prior_token_ids=prior,
        output_type="np",
        **kwargs,
    )
    return np.asarray(out.images)


def dit_engine(**args):
    """The DiT stage's engine as the pipeline configures it (its family registered: its step adapter)."""
    from omnistage.config.deploy import StageDeploy
    from omnistage.families import registry
    from omnistage.stages.diffusion.engine import DiffusionEngine

    registry.load()
    args = {"skip_components": ["vision_language_encoder", "processor"], **args}
    return DiffusionEngine(
        str(tiny_glm_image_dir()), StageDeploy(stage_id=1, max_num_seqs=4), "cpu", args, "image"
    )


def test_step_caching_applies_and_cfg_parallel_is_refused() -> None:
    from omnistage.errors import ConfigError

    engine = dit_engine()
    prior = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    params = DiffusionParams(height=64, width=64, num_inference_steps=8, seed=7, cache="cache_dit")
    engine.add_request(StageRequest("cached", prompt="a cat", params=params, inputs=prior))
    finals = [out for _ in iter(engine.has_work, False) for out in engine.step() if out.finished]
    assert finals[0].error is None and finals[0].metrics["cached_steps"] >= 1
    with pytest.raises(ConfigError, match="not split across ranks"):
        dit_engine(cfg_parallel_size=2)


def test_the_dit_renders_the_reference_image_alone_and_batched() -> None:
    """Step by step, from given prior tokens, several requests sharing forwards (no token budget) whose
    glyph texts differ in length; 2 images from one prompt."""
    engine = dit_engine(step_token_budget=0)
    assert engine.runner.pipe.vision_language_encoder is None and engine.mode == "step"
    gen = torch.Generator().manual_seed(11)
    texts = [p[0] for p in PROMPTS]
    priors = [torch.randint(0, 64, (1, 16), generator=gen) for _ in texts]
    for i, (text, prior) in enumerate(zip(texts, priors, strict=True)):
        params = DiffusionParams(
            height=64,
            width=64,
            num_inference_steps=3,
            seed=7,
            output_format="tensor",
            num_outputs=1 + (i == 0),
        )
        engine.add_request(StageRequest(f"d{i}", prompt=text, params=params, inputs=prior))
    results = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            if out.finished:
                results[out.request_id] = out.images.numpy()
    for i, (text, prior) in enumerate(zip(texts, priors, strict=True)):
        want = reference_image(text, 64, prior, num_images_per_prompt=1 + (i == 0))
        assert results[f"d{i}"].shape == want.shape
        assert np.abs(results[f"d{i}"] - want).max() < 1e-4, i


def test_the_pipeline_equals_one_pipeline_call() -> None:
    """Both stages (offline API): the AR's tokens at the pipeline's default size, then the DiT; the
    reference is one `GlmImagePipeline` call with the same seed."""
    from omnistage import Omni

    text = PROMPTS[1][0]
    with Omni(str(tiny_glm_image_dir()), "omnistage/families/glm_image/glm_image_inline.yaml") as omni:
        dit = DiffusionParams(num_inference_steps=3, seed=7, output_format="tensor")
        out = omni.generate(text, [SamplingParams(top_k=1), dit], use_tqdm=False)[0]
        wrong = DiffusionParams(num_inference_steps=3, height=64)
        refused = omni.generate(text, [SamplingParams(top_k=1), wrong], use_tqdm=False)[0]
    assert out.error is None, out.error
    want = reference_image(text, 32)[0]
    got = np.asarray(out.images[0])
    assert got.shape == want.shape == (32, 32, 3) and np.abs(got - want).max() < 1e-4
    assert want.std() > 0
    assert refused.error is not None and "height" in str(refused.error)


def picture(seed: int, size: tuple[int, int] = (64, 64)):
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size[::-1], 3), dtype=np.uint8))


def reference_edit(text: str, size: int, source) -> np.ndarray:
    """`GlmImagePipeline.__call__` editing `source`, its prior tokens from `generate` on the processor's
    prompt with the image (the model's own forward tokenizes the source: diffusers 0.42.1's
    `generate_prior_tokens` fails on image inputs beside transformers 5.25, see decoder.py)."""
    from omnistage.families.glm_image.decoder import upsampled

    pipe = reference_pipeline()
    model = pipe.vision_language_encoder
    messages = [
        [{"role": "user", "content": [{"type": "image", "image": source}, {"type": "text", "text": text}]}]
    ]
    inputs = pipe.processor.apply_chat_template(
        messages, tokenize=True, target_h=size, target_w=size, return_dict=True, return_tensors="pt"
    )
    source_grid, (_, rows, columns) = inputs["image_grid_thw"][0], inputs["image_grid_thw"][-1].tolist()
    torch.manual_seed(0)
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=rows * columns + 1, do_sample=True)
        features = model.get_image_features(
            inputs["pixel_values"], inputs["image_grid_thw"][:1]
        ).pooler_output
        source_tokens = model.get_image_tokens(features)
    written = out[0, inputs["input_ids"].shape[1] :][: rows * columns]
    grid = source_grid.clone()
    grid[1:] *= 2
    return reference_image(
        text,
        size,
        upsampled(written, rows, columns),
        image=[source],
        prior_token_image_ids=[upsampled(source_tokens, *source_grid[1:].tolist())[0]],
        source_image_grid_thw=[grid[None]],
    )


def test_an_edit_equals_one_pipeline_call() -> None:
    """Image to image: the source image's VQ tokens in the AR prompt, the target grid alone written, the
    DiT attending the source's cached keys and values; one `GlmImagePipeline` call with the image."""
    from omnistage import Omni
    from omnistage.prompts import TextPrompt

    text, source = "make it blue", picture(3)
    with Omni(str(tiny_glm_image_dir()), "omnistage/families/glm_image/glm_image_inline.yaml") as omni:
        ar = SamplingParams(top_k=1, extra={"height": 64, "width": 64})
        dit = DiffusionParams(num_inference_steps=3, seed=7, output_format="tensor")
        out = omni.generate(TextPrompt(text=text, images=[source]), [ar, dit], use_tqdm=False)[0]
    assert out.error is None, out.error
    want = reference_edit(text, 64, source)[0]
    got = np.asarray(out.images[0])
    assert got.shape == want.shape == (64, 64, 3) and np.abs(got - want).max() < 1e-4
    assert np.abs(want - reference_image(text, 64)[0]).max() > 1e-3  # the source image mattered
