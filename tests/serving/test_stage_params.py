"""Request fields reach the right stage, and bad values are errors that name the field."""

import pytest

from omnistage.config.pipeline import PipelineSpec, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.params import DiffusionParams, GenerationParams, SamplingParams
from omnistage.serving.served import ServedModel
from omnistage.serving.stage_params import build_stage_params, diffusion_fields, parse_size

pytestmark = pytest.mark.unit

SPEECH = PipelineSpec(
    name="speech",
    stages=(
        StageSpec(0, "thinker", "ar", final_output=True, output_modality="text"),
        StageSpec(1, "talker", "ar", inputs=(0,)),
        StageSpec(2, "vocoder", "generation", inputs=(1,), final_output=True, output_modality="audio"),
    ),
)
IMAGE = PipelineSpec(
    name="image", stages=(StageSpec(0, "dit", "diffusion", final_output=True, output_modality="image"),)
)


def served(pipeline: PipelineSpec) -> ServedModel:
    return ServedModel(name=pipeline.name, omni=None, pipeline=pipeline)


def test_sampling_fields_go_to_the_entry_ar_stage_only():
    params = build_stage_params(
        served(SPEECH), sampling={"temperature": 0.0, "max_tokens": 5}, generation={"seed": 3}
    )
    assert params[0] == SamplingParams(temperature=0.0, max_tokens=5)
    assert params[1] is None  # the talker keeps its own defaults
    assert params[2] == GenerationParams(seed=3)


def test_stage_params_override_and_extend_per_stage():
    params = build_stage_params(
        served(SPEECH),
        sampling={"temperature": 0.5},
        stage_params=[{"temperature": 0.0, "top_k": 1}, None, {"seed": 7}],
    )
    assert params[0] == SamplingParams(temperature=0.0, top_k=1)
    assert params[1] is None and params[2] == GenerationParams(seed=7)


@pytest.mark.parametrize(
    ("stage_params", "param", "text"),
    [
        ([None, {"temprature": 1.0}], "stage_params[1].temprature", "not a SamplingParams field"),
        ([{"temperature": "hot"}], "stage_params[0].temperature", "Expected `float`"),
        ([{"top_p": 0.0}], "stage_params[0].top_p", "must be in (0, 1]"),
        ([None, None, {"seed": "x"}], "stage_params[2].seed", "Expected `int | null`"),
        (
            [{"logits_processors": ["os:system"]}],
            "stage_params[0].logits_processors",
            "cannot be set over HTTP",
        ),
    ],
)
def test_bad_stage_params_name_the_field(stage_params, param, text):
    with pytest.raises(InvalidRequestError) as info:
        build_stage_params(served(SPEECH), stage_params=stage_params)
    assert info.value.param == param
    assert text in info.value.message


def test_top_level_errors_name_the_top_level_field():
    with pytest.raises(InvalidRequestError) as info:
        build_stage_params(served(SPEECH), sampling={"min_tokens": 9, "max_tokens": 3})
    assert info.value.param == "min_tokens"


def test_too_many_stage_params_entries():
    with pytest.raises(InvalidRequestError, match="4 entries but model 'speech' has 3 stages"):
        build_stage_params(served(SPEECH), stage_params=[None] * 4)


def test_diffusion_fields_and_pixel_limit():
    class Body:
        size, width, height = "64x32", None, None
        negative_prompt, num_inference_steps, guidance_scale, true_cfg_scale = "blur", 3, None, None
        guidance_scale_2 = None

    fields = diffusion_fields(Body, max_pixels=64 * 32, seed=1, num_outputs=2)
    assert fields == {
        "negative_prompt": "blur",
        "num_inference_steps": 3,
        "width": 64,
        "height": 32,
        "seed": 1,
        "num_outputs": 2,
    }
    assert build_stage_params(served(IMAGE), diffusion=fields)[0] == DiffusionParams(**fields)
    with pytest.raises(InvalidRequestError, match="64x32 exceeds the maximum of 100 pixels") as info:
        diffusion_fields(Body, max_pixels=100)
    assert info.value.param == "size"


def test_parse_size():
    assert parse_size("640x480") == (640, 480)
    assert parse_size("auto") is None and parse_size(None) is None
    with pytest.raises(InvalidRequestError):
        parse_size("640x")
