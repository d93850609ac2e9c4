"""The committed demo model: plain diffusers loads it, omnistage serves it as images and clips."""

import json

import numpy as np
import pytest
from diffusers import DiffusionPipeline

from omnistage.demo.model import demo_model_dir

pytestmark = pytest.mark.engine

MAX_BYTES = 30 * 1024 * 1024
# The quality bar of issue 7 (colour, shape, motion, cache-dit reuse) is measured by
# `omnistage demo train --phases eval`, not here: the committed weights (DiT step 200) do not meet it yet,
# and a test that is never run would only pretend to hold it.


@pytest.fixture(scope="module")
def pipe():
    pipe = DiffusionPipeline.from_pretrained(demo_model_dir())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_directory_is_a_standard_wan_pipeline(pipe):
    index = json.loads((demo_model_dir() / "model_index.json").read_text())
    assert index["_class_name"] == "WanPipeline"
    assert type(pipe).__name__ == "WanPipeline"
    assert type(pipe.transformer).__name__ == "WanTransformer3DModel"
    assert type(pipe.vae).__name__ == "AutoencoderKLWan"
    assert type(pipe.text_encoder).__name__ == "UMT5EncoderModel"
    assert type(pipe.scheduler).__name__ == "FlowMatchEulerDiscreteScheduler"
    assert pipe.transformer.config.num_layers >= 9  # cache-dit's default DBCache computes 8 front blocks
    weights = sum(p.stat().st_size for p in demo_model_dir().rglob("*.safetensors"))
    assert 0 < weights <= MAX_BYTES


def test_omnistage_serves_it_as_images_and_clips_at_its_native_size():
    """Resolved to the two-stage demo pipeline, so /v1/images/generations and /v1/videos both find it and a
    request that names no size gets 32x32 (not Wan's 480x832x81)."""
    from omnistage import DiffusionParams, Omni
    from omnistage.config.resolve import resolve_pipeline
    from omnistage.demo import demo_model_dirs
    from omnistage.pipelines.demo_shapes import DEMO_SHAPES_PIPELINE

    assert demo_model_dir() in demo_model_dirs()
    assert resolve_pipeline(demo_model_dir())[0] is DEMO_SHAPES_PIPELINE
    params = DiffusionParams(num_inference_steps=2, seed=0)
    with Omni(demo_model_dir(), placement="inline") as omni:
        assert set(omni.pipeline.modalities) == {"image", "video"}
        (image,) = omni.generate(["a red circle"], params, modalities=["image"], use_tqdm=False)
        (clip,) = omni.generate(["a red circle moving up"], params, modalities=["video"], use_tqdm=False)
    assert image.error is None and clip.error is None
    assert np.asarray(image.images[0]).shape == (32, 32, 3)
    assert tuple(clip.video.shape[-4:]) == (9, 32, 32, 3) and clip.fps == 8
