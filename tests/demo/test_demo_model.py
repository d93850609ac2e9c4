"""The committed demo model: plain diffusers loads it, omnistage serves it as images and clips."""

import json

import numpy as np
import pytest
from diffusers import DiffusionPipeline

from omnistage.demo.model import demo_model_dir

pytestmark = pytest.mark.engine

MAX_BYTES = 30 * 1024 * 1024


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


def test_images_take_the_colour_and_place_their_held_out_captions_name(pipe):
    """Held-out captions (colour x shape x position combinations the trainer never saw), the pipeline's
    default guidance, 20 steps (a third of the time of its default 50; measured on the 24 captions: colour
    1.00, position 0.79 at 20 steps and at 30): the colour is right in at least 80% (issue 7's bar) and the
    position (one of nine cells, chance 11%) in at least 60%. Shape does not reach its bar (60%) yet, so it
    is reported, not asserted (see docs/demo_model.md)."""
    from omnistage.demo.evaluate import generate, held_out_scenes, score_images

    scenes = held_out_scenes(1)[0]
    frames = generate(pipe, [scene.caption for scene in scenes], num_frames=1, steps=20)
    assert frames.shape == (len(scenes), 1, 32, 32, 3)
    scores = score_images(frames, scenes)
    print("held-out images:", scores)
    assert scores["colour"] >= 0.8
    assert scores["position"] >= 0.6


def test_clips_move_the_way_their_held_out_captions_say(pipe):
    """Held-out (colour, shape, direction) captions, 9 frames: the shape's centroid moves the stated way in
    at least 70% of clips (issue 7's bar), measured on the pixels. 20 steps keep the test short; the
    evaluation at the default 50 steps scores higher (docs/demo_model.md)."""
    from omnistage.demo.evaluate import generate, held_out_scenes, score_clips

    scenes = held_out_scenes(1)[1]
    frames = generate(pipe, [scene.caption for scene in scenes], num_frames=scenes[0].num_frames, steps=20)
    assert frames.shape == (len(scenes), 9, 32, 32, 3)
    scores = score_clips(frames, scenes)
    print("held-out clips:", scores)
    assert scores["motion"] >= 0.7


def test_dbcache_at_its_defaults_reuses_steps_of_the_trained_model_and_keeps_the_image():
    """cache-dit's DBCache with every default, 20 steps, on two held-out captions: the trained model's
    trajectory is smooth enough that some transformer calls come from cache (a random model's never do),
    the cached images stay close to the uncached ones, and the profile of what DBCache compares (recorded on
    the uncached run) has 19 step-to-step changes, larger at the ends of the trajectory than in the middle."""
    from omnistage.demo.evaluate import cache_report, held_out_scenes

    report = cache_report(demo_model_dir(), [scene.caption for scene in held_out_scenes(1)[0][:2]])
    print("cache report:", report)
    assert report["cached_fraction_min"] > 0
    assert report["psnr_db_min"] >= 30
    profile = report["front_residual_change_by_step"]
    assert len(profile) == 19
    middle = min(profile[5:14])
    assert profile[0] > middle and profile[-1] > middle


def test_omnistage_serves_it_as_images_and_clips_at_its_native_size():
    """Resolved to the two-stage demo pipeline, so /v1/images/generations and /v1/videos both find it and a
    request that names no size gets 32x32 (not Wan's 480x832x81)."""
    from omnistage import DiffusionParams, Omni
    from omnistage.demo import demo_model_dirs
    from omnistage.families.resolve import resolve_pipeline
    from omnistage.families.wan.shapes import DEMO_SHAPES_PIPELINE

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
