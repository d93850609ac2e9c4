"""Any diffusers directory resolves to a one-stage DIFFUSION pipeline; Stable Audio runs step by step
(omnistage/families/stable_audio), equal to the plain pipeline, with WAV-ready audio out."""

from __future__ import annotations

import pytest
import torch

from omnistage.config.deploy import resolve_deploy
from omnistage.config.pipeline import StageKind, load_ref
from omnistage.families.resolve import resolve_pipeline
from omnistage.stages.base import EngineContext
from tests.diffusion.helpers import drain, model_dir, plain_pipeline, request

MODALITIES = {
    "tiny-wan21-t2v": "video",
    "tiny-wan22-i2v": "video",
    "tiny-flux1": "image",
    "tiny-sd3": "image",
    "tiny-qwen-image": "image",
    "tiny-stable-audio": "audio",
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(MODALITIES))
def test_diffusers_directory_resolves_to_one_diffusion_stage(name):
    spec, info = resolve_pipeline(model_dir(name))
    assert len(spec.stages) == 1 and spec.stages[0].kind is StageKind.DIFFUSION
    assert spec.modalities == (MODALITIES[name],)
    assert info.diffusers_class in spec.diffusers_classes
    deploy = resolve_deploy(spec)
    assert deploy.stage(0).max_num_seqs == 4 and deploy.stage(0).engine_args["step_policy"] == "srpt"


STABLE_AUDIO = [  # defaults; a negative prompt with guidance; a shorter clip without CFG; two outputs
    ("a", "a drum loop", {"seed": 4}),
    ("b", "rain on a roof", {"seed": 5, "negative_prompt": "hum", "guidance_scale": 4.0}),
    ("c", "birds at dawn", {"seed": 6, "guidance_scale": 1.0, "extra": {"audio_end_in_s": 0.004}}),
    ("d", "wind in the trees", {"seed": 7, "num_outputs": 2}),
]


def stable_audio_engine():
    """Through the default factory, with the deploy its resolved pipeline gets."""
    spec, _ = resolve_pipeline(model_dir("tiny-stable-audio"))
    deploy = resolve_deploy(spec, cli={"dtype": "float32"})
    factory = load_ref(spec.stages[0].engine_ref)
    return factory(
        EngineContext(stage=spec.stages[0], deploy=deploy.stage(0), model_dir=model_dir("tiny-stable-audio"))
    )


def stable_audio_reference(prompt: str, fields: dict) -> torch.Tensor:
    fields = dict(fields)
    seed, extra, n = fields.pop("seed"), fields.pop("extra", {}), fields.pop("num_outputs", 1)
    call = {**fields, **extra, "num_waveforms_per_prompt": n, "num_inference_steps": 3, "output_type": "np"}
    return torch.as_tensor(
        plain_pipeline("tiny-stable-audio")(
            prompt=prompt, generator=torch.Generator().manual_seed(seed), **call
        ).audios
    )


@pytest.mark.engine
def test_stable_audio_runs_step_by_step_equal_to_the_plain_pipeline_alone_and_batched():
    """The step adapter of omnistage/families/stable_audio: each clip equals the plain call's, stereo at the
    checkpoint's rate (mono mixed down beside it), alone and in one batch of four."""
    alone = stable_audio_engine()
    assert alone.mode == "step"
    together = stable_audio_engine()
    for rid, prompt, fields in STABLE_AUDIO:
        params = {**fields, "num_inference_steps": 3, "output_format": "wav"}
        alone.add_request(request(rid, prompt, **params))
        solo = drain(alone)[rid][-1]
        together.add_request(request(rid, prompt, **params))
        expected = stable_audio_reference(prompt, fields)
        stereo = solo.tensors.get("audios", solo.audio[None, None])
        assert solo.sample_rate == 16000 and stereo.shape == expected.shape, (stereo.shape, expected.shape)
        assert (stereo - expected).abs().max() <= 1e-4, rid
        assert torch.allclose(solo.audio, stereo[0].mean(0))
    outs = drain(together)
    for rid, prompt, fields in STABLE_AUDIO:
        expected = stable_audio_reference(prompt, fields)
        assert (outs[rid][-1].tensors["audios"] - expected).abs().max() <= 1e-4, rid


@pytest.mark.engine
def test_a_stable_audio_clip_aborted_between_steps_frees_its_slot():
    engine = stable_audio_engine()
    engine.add_request(request("long", "a drum loop", num_inference_steps=6, seed=1))
    engine.add_request(request("keep", "rain", num_inference_steps=2, seed=2))
    seen: list = []
    while not any(o.request_id == "long" and o.progress for o in seen):
        seen += engine.step()  # until the long clip has taken a step
    engine.abort("long")
    assert "long" not in engine.requests
    rest = drain(engine)
    kept = [o for o in seen if o.request_id == "keep"] + rest.get("keep", [])
    assert "long" not in rest and kept[-1].finished and kept[-1].error is None
    assert engine.stats()["num_requests"] == 0
