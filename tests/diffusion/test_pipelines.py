"""Any diffusers directory resolves to a one-stage DIFFUSION pipeline; a family without a step adapter
(Stable Audio) is served as whole pipeline calls with WAV-ready audio out."""

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


@pytest.mark.engine
def test_stable_audio_runs_whole_calls_through_the_default_factory():
    spec, _ = resolve_pipeline(model_dir("tiny-stable-audio"))
    deploy = resolve_deploy(spec, cli={"dtype": "float32"})
    factory = load_ref(spec.stages[0].engine_ref)
    engine = factory(
        EngineContext(stage=spec.stages[0], deploy=deploy.stage(0), model_dir=model_dir("tiny-stable-audio"))
    )
    assert engine.mode == "request"
    params = {"num_inference_steps": 3, "seed": 4, "output_format": "wav"}
    engine.add_request(request("a", "a drum loop", **params))
    engine.add_request(request("b", "rain on a roof", **{**params, "seed": 5}))
    outs = drain(engine)
    expected = plain_pipeline("tiny-stable-audio")(
        prompt=["a drum loop", "rain on a roof"], num_inference_steps=3, output_type="np",
        generator=[torch.Generator().manual_seed(4), torch.Generator().manual_seed(5)],
    ).audios  # fmt: skip
    for i, rid in enumerate(["a", "b"]):
        out = outs[rid][-1]
        assert out.sample_rate == 16000 and out.audio is not None
        stereo = out.tensors["audios"][0]
        assert stereo.shape == (2, 128)
        assert (stereo - torch.as_tensor(expected[i])).abs().max() <= 1e-4
        assert torch.allclose(out.audio, stereo.mean(0))
