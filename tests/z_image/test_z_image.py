"""Z-Image step by step (omnistage/families/z_image, a tiny checkpoint of diffusers' and transformers' own
classes): each image equals the plain `ZImagePipeline` call for the same seed within 1e-4, alone and five
at once sharing forwards (prompts of different lengths, a negative prompt, no guidance, two outputs at
another size, guidance truncated and renormalized part-way); an abort between steps frees the slot; the
served model draws through the official `openai` client."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.families.z_image.tiny import tiny_z_image_dir
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
CASES = [
    ("a", "a cat on a bench", {"seed": 1}),
    ("b", "a red fox running through the snowy forest", {"seed": 2, "negative_prompt": "blurry"}),
    ("c", "waves", {"seed": 3, "guidance_scale": 0.0}),
    ("d", "a robot", {"seed": 4, "num_outputs": 2, "height": 48}),
    ("e", "a lake", {"seed": 5, "extra": {"cfg_truncation": 0.5, "cfg_normalization": 1.0}}),
]


def engine(**engine_args) -> DiffusionEngine:
    return family_engine(tiny_z_image_dir(), **engine_args)


def plain_pipeline():
    return plain_pipeline_at(str(tiny_z_image_dir()))


def reference(prompt: str, fields: dict) -> torch.Tensor:
    call = {**BASE, **fields}
    call.pop("output_format")
    seed, extra, n = call.pop("seed"), call.pop("extra", {}), call.pop("num_outputs", 1)
    generator = torch.Generator().manual_seed(seed)
    images = plain_pipeline()(
        prompt, generator=generator, output_type="np", num_images_per_prompt=n, **call, **extra
    )
    return torch.as_tensor(images.images)


@pytest.fixture(scope="module")
def references() -> dict[str, torch.Tensor]:
    return {rid: reference(prompt, fields) for rid, prompt, fields in CASES}


def test_each_image_equals_the_plain_pipeline_alone(references) -> None:
    solo = engine()
    assert solo.mode == "step"
    assert_each_close(each_alone(solo, CASES, BASE), references, TOLERANCE)


def test_five_at_once_share_forwards_and_each_equals_the_plain_pipeline(references) -> None:
    # No per-forward budget: same-shape requests share every forward.
    first, got = all_at_once(engine(step_token_budget=0), CASES, BASE)
    assert first >= {"a", "b", "c", "e"}  # one forward for the 32x32 ones
    assert_each_close(got, references, TOLERANCE)


def test_an_abort_between_steps_frees_the_slot() -> None:
    check_an_abort_frees_the_slot(engine(step_token_budget=0), BASE)


def test_the_served_model_draws_through_the_openai_client(tmp_path, references) -> None:
    from openai import OpenAI

    from tests.support.in_process import served

    for app in served(tiny_z_image_dir(), "z-image", tmp_path):
        client = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=app, max_retries=0)
        extra = {"num_inference_steps": 3, "seed": 1, "stage_params": [{"max_sequence_length": 32}]}
        reply = client.images.generate(
            model="z-image", prompt="a cat on a bench", size="32x32", extra_body=extra
        )
        got = np.asarray(Image.open(io.BytesIO(base64.b64decode(reply.data[0].b64_json))), dtype=np.int16)
        want = np.round(references["a"][0].numpy() * 255).astype(np.int16)
        assert np.abs(got - want).max() <= 1
