"""HunyuanVideo-1.5 text to video step by step (omnistage/families/hunyuan_video15, a tiny checkpoint of
diffusers' and transformers' own classes): each clip equals the plain `HunyuanVideo15Pipeline` call for the
same seed within 1e-4 (its guider at the request's guidance scale), alone and four at once (a quoted glyph
text, a negative prompt, no guidance, another length); an abort between steps frees the slot. Image to video
likewise (images of two aspects at once), and served: `/v1/videos` with `input_reference`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.families.hunyuan_video15.tiny import tiny_hunyuan_video15_dir
from omnistage.serving import media as served_media
from omnistage.stages.diffusion.engine import DiffusionEngine
from tests.diffusion.helpers import (
    all_at_once,
    assert_each_close,
    check_an_abort_frees_the_slot,
    drain,
    each_alone,
    family_engine,
    final_tensor,
    plain_pipeline_at,
    request,
)

pytestmark = pytest.mark.engine
TOLERANCE = 1e-4
BASE = {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 3, "output_format": "tensor"}
CASES = [
    ("a", "a cat walking", {"seed": 1}),
    ("b", 'a sign that says "OPEN" in the rain', {"seed": 2, "negative_prompt": "blurry"}),
    ("c", "waves", {"seed": 3, "guidance_scale": 1.0}),
    ("d", "a robot", {"seed": 4, "guidance_scale": 3.5, "num_frames": 9}),
]


def engine(**engine_args) -> DiffusionEngine:
    return family_engine(tiny_hunyuan_video15_dir(), **engine_args)


def plain_pipeline():
    return plain_pipeline_at(str(tiny_hunyuan_video15_dir()))


def reference(prompt: str, fields: dict) -> torch.Tensor:
    """The plain call; a guidance scale goes to its guider, as the pipeline takes it."""
    call = {**BASE, **fields}
    call.pop("output_format")
    seed, scale = call.pop("seed"), call.pop("guidance_scale", None)
    pipe = plain_pipeline()
    guider = pipe.guider
    pipe.guider = guider.new(guidance_scale=scale) if scale is not None else guider
    try:
        frames = pipe(
            prompt=prompt, generator=torch.Generator().manual_seed(seed), output_type="np", **call
        ).frames
    finally:
        pipe.guider = guider
    return torch.as_tensor(frames)


@pytest.fixture(scope="module")
def references() -> dict[str, torch.Tensor]:
    return {rid: reference(prompt, fields) for rid, prompt, fields in CASES}


def test_each_clip_equals_the_plain_pipeline_alone_and_four_at_once(references) -> None:
    solo = engine()
    assert solo.mode == "step"
    assert_each_close(each_alone(solo, CASES, BASE), references, TOLERANCE)
    # No per-forward budget: same-shape requests share forwards.
    first, got = all_at_once(engine(step_token_budget=0), CASES, BASE)
    assert first >= {"a", "b", "c"}
    assert_each_close(got, references, TOLERANCE)


def test_an_abort_between_steps_frees_the_slot() -> None:
    check_an_abort_frees_the_slot(engine(step_token_budget=0), BASE)


# ---- image to video ---------------------------------------------------------------------------------------
WIDE = Image.fromarray((np.random.RandomState(0).rand(48, 64, 3) * 255).astype("uint8"))
SQUARE = Image.fromarray((np.random.RandomState(1).rand(64, 64, 3) * 255).astype("uint8"))
I2V_BASE = {"num_frames": 5, "num_inference_steps": 3, "output_format": "tensor"}
I2V_CASES = [
    ("a", "a cat walking", {"seed": 1}, WIDE),
    ("b", "waves", {"seed": 2, "guidance_scale": 1.0}, WIDE),
    ("c", "a robot", {"seed": 3}, SQUARE),  # another aspect: another video size, its own forward
]


def test_image_to_video_equals_the_plain_pipeline_alone_and_three_at_once() -> None:
    directory = tiny_hunyuan_video15_dir(image_to_video=True)
    pipe = plain_pipeline_at(str(directory))
    expected = {}
    for rid, prompt, fields, image in I2V_CASES:
        scale = fields.get("guidance_scale")
        default_guider = pipe.guider
        pipe.guider = default_guider.new(guidance_scale=scale) if scale is not None else default_guider
        generator = torch.Generator().manual_seed(fields["seed"])
        frames = pipe(
            image=image, prompt=prompt, generator=generator, num_frames=5, num_inference_steps=3
        ).frames
        pipe.guider = default_guider
        expected[rid] = torch.as_tensor(frames)
    for args in (
        {},
        {"step_token_budget": 0},
    ):  # alone (one request a forward, the CPU default), then sharing
        eng = family_engine(directory, **args)
        for rid, prompt, fields, image in I2V_CASES:
            eng.add_request(request(rid, prompt, image=[image], **{**I2V_BASE, **fields}))
        outs = drain(eng)
        for rid, *_ in I2V_CASES:
            got = final_tensor(outs[rid][-1])
            assert (got.reshape(expected[rid].shape) - expected[rid]).abs().max() <= TOLERANCE, rid


def ended(client, video_id: str):
    job = client.videos.retrieve(video_id)
    return job if job.status in ("completed", "failed") else None


def test_videos_take_the_image_as_input_reference(tmp_path) -> None:
    """`/v1/videos` with `input_reference` (the official client's file, or a data URL in JSON) makes the
    image-to-video clip at the image's aspect, as a job and as a sync answer."""
    import base64
    import io

    from openai import OpenAI

    from tests.support.in_process import served
    from tests.support.polling import wait_until

    upload = io.BytesIO()
    WIDE.save(upload, format="PNG")
    png = upload.getvalue()
    fields = {"num_frames": 5, "num_inference_steps": 3, "seed": 1, "fps": 8}
    for app in served(tiny_hunyuan_video15_dir(image_to_video=True), "i2v", tmp_path):
        client = OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=app, max_retries=0)
        job = client.videos.create(
            model="i2v",
            prompt="a cat walking",
            input_reference=("wide.png", png, "image/png"),
            extra_body=fields,
        )
        job = wait_until(lambda c=client, i=job.id: ended(c, i), what="the image-to-video job")
        assert job.status == "completed", job.error
        mp4 = client.videos.download_content(job.id).content
        data_url = "data:image/png;base64," + base64.b64encode(png).decode()
        sync = app.post(
            "/v1/videos/sync", json={"prompt": "a cat walking", "input_reference": data_url, **fields}
        )
        assert sync.status_code == 200, sync.text
        for clip in (mp4, sync.content):  # the image's 3:4 at the model's target size
            assert served_media.decode_video(clip, max_pixels=10**6, max_frames=99, param="v").shape == (
                5,
                28,
                36,
                3,
            )
