"""LTX-2 step by step (omnistage/families/ltx2, tiny checkpoints of diffusers' and transformers' own
classes): each clip's frames and its sound track equal the plain `LTX2Pipeline` call for the same seed
within 1e-4, alone and three at once (the pipeline's default guidance: CFG, STG and modality isolation; a
negative prompt at another scale; no guidance at all); an abort between steps frees the slot; a call
argument the steps do not serve is refused by name. Served: `/v1/videos` and chat answer MP4s whose FLAC
track decodes to the pipeline's waveform within 16-bit quantization. Image to video likewise
(`LTX2ImageToVideoPipeline`: two images, two clips from one request)."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage.families.ltx2.tiny import tiny_ltx2_dir
from omnistage.media import PCM16_SCALE
from omnistage.stages.diffusion.engine import DiffusionEngine
from tests.diffusion.helpers import (
    check_an_abort_frees_the_slot,
    drain,
    family_engine,
    plain_pipeline_at,
    request,
)

pytestmark = pytest.mark.engine
TOLERANCE = 1e-4
BASE = {
    "height": 32,
    "width": 32,
    "num_frames": 5,
    "num_inference_steps": 2,
    "max_sequence_length": 16,
    "output_format": "tensor",
}
UNGUIDED = {
    "audio_guidance_scale": 1.0,
    "stg_scale": 0.0,
    "audio_stg_scale": 0.0,
    "modality_scale": 1.0,
    "audio_modality_scale": 1.0,
}
CASES = [
    ("a", "a cat walking", {"seed": 1}),
    ("b", "waves on a rocky shore", {"seed": 2, "negative_prompt": "blurry", "guidance_scale": 4.0}),
    ("c", "a small robot", {"seed": 3, "guidance_scale": 1.0, "extra": UNGUIDED}),
]


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(frames, waveform) of each case from the plain pipeline call, written out by hand."""
    pipe = plain_pipeline_at(str(tiny_ltx2_dir()))
    out = {}
    for rid, prompt, fields in CASES:
        call = {**BASE, **fields}
        call.pop("output_format")
        seed, extra = call.pop("seed"), call.pop("extra", {})
        result = pipe(
            prompt=prompt, generator=torch.Generator().manual_seed(seed), output_type="np", **call, **extra
        )
        out[rid] = (torch.as_tensor(result.frames), result.audio.float())
    return out


@pytest.fixture(scope="module")
def engine() -> DiffusionEngine:
    """One engine for the module; no per-forward token budget, so requests at once share forwards."""
    return family_engine(tiny_ltx2_dir(), step_token_budget=0)


def clips(outputs: dict[str, list]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each request's final (frames, every channel of its waveform)."""
    found = {}
    for rid, outs in outputs.items():
        final = outs[-1]
        assert final.finished and final.error is None, final.error
        found[rid] = (final.video, final.tensors["audios"])
    return found


def assert_clips_close(got: dict, expected: dict) -> None:
    for rid, (frames, audio) in expected.items():
        assert (got[rid][0].reshape(frames.shape) - frames).abs().max() <= TOLERANCE, rid
        assert (got[rid][1].reshape(audio.shape) - audio).abs().max() <= TOLERANCE, rid


def test_each_clip_and_its_sound_equal_the_plain_pipeline_alone_and_three_at_once(engine, references) -> None:
    assert engine.mode == "step"
    alone = {}
    for rid, prompt, fields in CASES:
        engine.add_request(request(rid, prompt, **{**BASE, **fields}))
        alone.update(clips(drain(engine)))
    assert_clips_close(alone, references)
    assert engine.runner.adapter.sample_rate() == 16000

    for rid, prompt, fields in CASES:
        engine.add_request(request(rid, prompt, **{**BASE, **fields}))
    first = {o.request_id for o in engine.step()}
    assert first == {"a", "b", "c"}  # one step shared by all three
    assert_clips_close(clips(drain(engine)), references)


def test_an_abort_between_steps_frees_the_slot(engine) -> None:
    check_an_abort_frees_the_slot(engine, BASE)


def test_a_call_argument_the_steps_do_not_serve_is_refused_by_name(engine) -> None:
    engine.add_request(request("x", "a cat", **BASE, extra={"enable_prompt_enhancement": True}))
    (out,) = drain(engine)["x"]
    assert out.error_param == "extra" and "enable_prompt_enhancement" in out.error


def mp4_audio(data: bytes) -> tuple[np.ndarray, int, str]:
    """The MP4's sound track: (float `[C, N]` samples, sample rate, codec), decoded with PyAV."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = list(container.decode(stream))
        channels = frames[0].layout.nb_channels
        pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
        return pcm.reshape(-1, channels).T / PCM16_SCALE, stream.sample_rate, stream.codec_context.name


def ended(app, video_id: str) -> dict | None:
    job = app.get(f"/v1/videos/{video_id}").json()
    return job if job["status"] in ("completed", "failed") else None


def test_videos_and_chat_answer_mp4s_with_the_clip_sound_track(tmp_path, references) -> None:
    """`/v1/videos` (a job) and `/v1/chat/completions` (a video part): each MP4 carries the clip's waveform
    as a FLAC track, within 16-bit quantization of the pipeline's. Its frames are not compared: H.264 of
    noisy tiny clips turns last-bit float differences into visible ones."""
    from tests.support.in_process import served
    from tests.support.polling import wait_until

    rid, prompt, fields = CASES[0]
    # Chat has no num_frames field: the stage's own params carry it (and the text length).
    body = {
        "size": "32x32",
        "num_inference_steps": 2,
        "seed": fields["seed"],
        "stage_params": [{"num_frames": 5, "max_sequence_length": 16}],
    }
    for app in served(tiny_ltx2_dir(), "ltx2", tmp_path):
        created = app.post("/v1/videos", json={"prompt": prompt, **body})
        assert created.status_code == 200, created.text
        video_id = created.json()["id"]
        job = wait_until(lambda a=app, v=video_id: ended(a, v), what="the video job")
        assert job["status"] == "completed", job["error"]
        job_mp4 = app.get(f"/v1/videos/{video_id}/content").content
        chat = app.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": prompt}], **body}
        )
        assert chat.status_code == 200, chat.text
        (part,) = chat.json()["choices"][0]["message"]["content"]
        chat_mp4 = base64.b64decode(part["video_url"]["url"].split(",", 1)[1])
    expected = references[rid][1][0].numpy()
    for mp4 in (job_mp4, chat_mp4):
        samples, rate, codec = mp4_audio(mp4)
        assert (codec, rate, samples.shape) == ("flac", 16000, expected.shape)
        assert np.abs(samples - expected).max() <= TOLERANCE + 0.5 / PCM16_SCALE


# ---- image to video ---------------------------------------------------------------------------------------
WIDE = Image.fromarray((np.random.RandomState(0).rand(48, 64, 3) * 255).astype("uint8"))
SQUARE = Image.fromarray((np.random.RandomState(1).rand(32, 32, 3) * 255).astype("uint8"))
I2V_CASES = [
    ("a", "a cat walking", {"seed": 1}, WIDE),
    ("b", "waves", {"seed": 2, "negative_prompt": "blurry", "guidance_scale": 4.0}, SQUARE),
    ("c", "a robot", {"seed": 3, "num_outputs": 2}, WIDE),
]


def test_image_to_video_equals_the_plain_pipeline_alone_and_three_at_once() -> None:
    """The image is the clip's first latent frame (H.264-recompressed as the model was trained, resized to the
    clip); one request makes two clips."""
    directory = tiny_ltx2_dir(image_to_video=True)
    pipe = plain_pipeline_at(str(directory))
    expected = {}
    for rid, prompt, fields, image in I2V_CASES:
        call = {**BASE, **fields}
        call.pop("output_format")
        seed, n = call.pop("seed"), call.pop("num_outputs", 1)
        generator = torch.Generator().manual_seed(seed)
        result = pipe(
            image=image, prompt=prompt, generator=generator, output_type="np", num_videos_per_prompt=n, **call
        )
        expected[rid] = (torch.as_tensor(result.frames), result.audio.float())
    engine = family_engine(directory, step_token_budget=0)
    alone = {}
    for rid, prompt, fields, image in I2V_CASES:
        engine.add_request(request(rid, prompt, image=[image], **{**BASE, **fields}))
        alone.update(clips(drain(engine)))
    assert_clips_close(alone, expected)
    for rid, prompt, fields, image in I2V_CASES:
        engine.add_request(request(rid, prompt, image=[image], **{**BASE, **fields}))
    assert {o.request_id for o in engine.step()} == {"a", "b", "c"}
    assert_clips_close(clips(drain(engine)), expected)
