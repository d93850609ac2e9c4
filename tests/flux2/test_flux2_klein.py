"""FLUX.2 Klein step by step (omnistage/families/flux2, a tiny checkpoint of diffusers' and transformers' own
classes): each image equals the plain `Flux2KleinPipeline` call for the same seed within 1e-4, alone and four
at once (with and without guidance, two outputs, an edit of a reference image in its own forward group);
an abort between steps frees the slot; through the official `openai` client, generations and edits equal
the plain pipeline's."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.families.flux2.tiny import tiny_flux2_klein_dir
from omnistage.stages.diffusion.engine import DiffusionEngine
from tests.diffusion.helpers import (
    all_at_once,
    assert_each_close,
    check_an_abort_frees_the_slot,
    each_alone,
    family_engine,
    plain_pipeline_at,
)

pytestmark = pytest.mark.engine
TOLERANCE = 1e-4
BASE = {
    "height": 32,
    "width": 32,
    "num_inference_steps": 3,
    "max_sequence_length": 32,
    "output_format": "tensor",
}
REFERENCE_IMAGE = Image.fromarray((np.random.RandomState(0).rand(64, 64, 3) * 255).astype("uint8"))
CASES = [
    ("a", "a cat on a bench", {"seed": 1}),
    ("b", "a red fox in the snow", {"seed": 2, "guidance_scale": 1.0}),
    ("c", "make it blue", {"seed": 3, "image": [REFERENCE_IMAGE]}),
    ("d", "a robot", {"seed": 4, "num_outputs": 2}),
]


def engine(**engine_args) -> DiffusionEngine:
    return family_engine(tiny_flux2_klein_dir(), **engine_args)


def plain_pipeline():
    return plain_pipeline_at(str(tiny_flux2_klein_dir()))


def reference(prompt: str, fields: dict) -> torch.Tensor:
    call = {**BASE, **fields}
    call.pop("output_format")
    seed, n, images = call.pop("seed"), call.pop("num_outputs", 1), call.pop("image", None)
    generator = torch.Generator().manual_seed(seed)
    result = plain_pipeline()(
        prompt=prompt,
        image=images[0] if images else None,
        generator=generator,
        output_type="np",
        num_images_per_prompt=n,
        **call,
    )
    return torch.as_tensor(result.images)


@pytest.fixture(scope="module")
def references() -> dict[str, torch.Tensor]:
    return {rid: reference(prompt, fields) for rid, prompt, fields in CASES}


def test_each_image_equals_the_plain_pipeline_alone_and_four_at_once(references) -> None:
    solo = engine()
    assert solo.mode == "step"
    assert_each_close(each_alone(solo, CASES, BASE), references, TOLERANCE)
    first, got = all_at_once(engine(step_token_budget=0), CASES, BASE)  # no per-forward budget: shared
    assert first == {"a", "b", "c", "d"}  # one step, the edit in its own group
    assert_each_close(got, references, TOLERANCE)


def test_an_abort_between_steps_frees_the_slot() -> None:
    check_an_abort_frees_the_slot(engine(step_token_budget=0), BASE)


def png_pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))), dtype=np.int16)


def as_uint8(image: torch.Tensor) -> np.ndarray:
    return np.round(image[0].numpy() * 255).astype(np.int16)


def test_generations_and_edits_through_the_openai_client(tmp_path, references) -> None:
    from openai import OpenAI

    from tests.support.in_process import served

    extra = {"num_inference_steps": 3, "stage_params": [{"max_sequence_length": 32}]}
    for app in served(tiny_flux2_klein_dir(), "klein", tmp_path):
        client = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=app, max_retries=0)
        made = client.images.generate(
            model="klein", prompt="a cat on a bench", size="32x32", extra_body={**extra, "seed": 1}
        )
        assert np.abs(png_pixels(made.data[0].b64_json) - as_uint8(references["a"])).max() <= 1
        upload = io.BytesIO()
        REFERENCE_IMAGE.save(upload, format="PNG")
        edited = client.images.edit(
            model="klein",
            image=("reference.png", upload.getvalue(), "image/png"),
            prompt="make it blue",
            size="32x32",
            extra_body={**extra, "seed": 3},
        )
        assert np.abs(png_pixels(edited.data[0].b64_json) - as_uint8(references["c"])).max() <= 1
