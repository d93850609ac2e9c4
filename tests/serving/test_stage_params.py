"""Request fields reach the right stage, layered over the stage's defaults field by field, and bad values are
errors that name the field."""

import pytest

from omnistage.api import StageParamsResolver
from omnistage.config.capabilities import Limits
from omnistage.config.deploy import resolve_deploy
from omnistage.config.pipeline import PipelineSpec, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.families.qwen2_5_omni.pipeline import QWEN2_5_OMNI, TALKER_DEFAULTS
from omnistage.params import DiffusionParams, SamplingParams
from omnistage.serving.served import ServedModel
from omnistage.serving.stage_params import build_stage_params, diffusion_fields, diffusion_origins, parse_size

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
    assert params[0] == {"temperature": 0.0, "max_tokens": 5}
    assert params[1] is None  # the talker keeps its own defaults
    assert params[2] == {"seed": 3}


def test_stage_params_override_and_extend_per_stage():
    params = build_stage_params(
        served(SPEECH),
        sampling={"temperature": 0.5},
        stage_params=[{"temperature": 0.0, "top_k": 1}, None, {"seed": 7}],
    )
    assert params[0] == {"temperature": 0.0, "top_k": 1}
    assert params[1] is None and params[2] == {"seed": 7}


def test_a_talker_override_keeps_the_other_talker_defaults():
    """Issue 26: `stage_params[1]` naming one talker field used to rebuild the talker's params from the
    class defaults, dropping TALKER_DEFAULTS' other fields."""
    served = ServedModel(name="omni", omni=None, pipeline=QWEN2_5_OMNI)
    request = build_stage_params(
        served, sampling={"max_tokens": 7}, stage_params=[None, {"temperature": 0.5}]
    )
    resolved = StageParamsResolver(QWEN2_5_OMNI, resolve_deploy(QWEN2_5_OMNI)).resolve(request)
    talker = resolved[1]
    assert talker.temperature == 0.5
    for name, value in TALKER_DEFAULTS.items():
        if name != "temperature":
            assert getattr(talker, name) == value, name
    assert talker.detokenize is False  # the talker's constraint still on top
    assert (
        resolved[0].max_tokens == 7 and resolved[0].return_hidden_states
    )  # the thinker: request + constraint
    # A field set back to its class default over a pipeline default changes just that field.
    request = build_stage_params(served, stage_params=[None, {"repetition_penalty": 1.0}])
    talker = StageParamsResolver(QWEN2_5_OMNI, resolve_deploy(QWEN2_5_OMNI)).resolve(request)[1]
    assert talker.repetition_penalty == 1.0 and talker.top_k == TALKER_DEFAULTS["top_k"]


def test_deploy_defaults_sit_between_the_pipeline_and_the_request():
    deploy = resolve_deploy(QWEN2_5_OMNI, {"stages": [{"stage_id": 1, "default_params": {"top_k": 5}}]})
    resolver = StageParamsResolver(QWEN2_5_OMNI, deploy)
    talker = resolver.resolve([None, SamplingParams(top_p=0.5), None])[1]
    assert (talker.top_k, talker.top_p, talker.temperature) == (5, 0.5, TALKER_DEFAULTS["temperature"])


def test_route_defaults_sit_under_the_model_defaults():
    """Chat's "no max_tokens: up to the context" applies unless the model's defaults name max_tokens."""
    talker_first = PipelineSpec(
        name="defaults",
        stages=(
            StageSpec(
                0, "llm", "ar", final_output=True, output_modality="text", default_params={"max_tokens": 9}
            ),
        ),
    )
    routed = build_stage_params(served(SPEECH), route_defaults={"max_tokens": None})
    assert routed[0] == {"max_tokens": None}
    assert build_stage_params(served(talker_first), route_defaults={"max_tokens": None})[0] is None
    asked = build_stage_params(
        served(talker_first), sampling={"max_tokens": 3}, route_defaults={"max_tokens": None}
    )
    assert asked[0] == {"max_tokens": 3}


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

    fields = diffusion_fields(Body, seed=1, num_outputs=2)
    assert fields == {
        "negative_prompt": "blur",
        "num_inference_steps": 3,
        "width": 64,
        "height": 32,
        "seed": 1,
        "num_outputs": 2,
    }
    assert build_stage_params(served(IMAGE), diffusion=fields)[0] == fields
    assert DiffusionParams(**fields).width == 64
    with pytest.raises(
        InvalidRequestError, match="64x32 = 2048 pixels exceeds this model's max_pixels of 100"
    ) as info:
        build_stage_params(
            served(IMAGE), diffusion=fields, limits=Limits(max_pixels=100), origins=diffusion_origins(Body)
        )
    assert info.value.param == "size"


@pytest.mark.parametrize(
    ("fields", "stage_params", "limits", "param", "text"),
    [
        (
            {"width": 100},
            None,
            Limits(max_width=64),
            "width",
            "width 100 exceeds this model's max_width of 64",
        ),
        ({"num_frames": 40}, None, Limits(max_frames=36), "num_frames", "max_frames of 36"),
        (
            {},
            [{"num_inference_steps": 500}],
            Limits(max_steps=100),
            "stage_params[0].num_inference_steps",
            "max_steps",
        ),
        ({}, [{"height": 2048}], Limits(max_pixels=4096), "stage_params[0].height", "2048x2048"),
    ],
)
def test_generation_limits_name_the_field_and_the_limit(fields, stage_params, limits, param, text):
    with pytest.raises(InvalidRequestError) as info:
        build_stage_params(served(IMAGE), diffusion=fields, stage_params=stage_params, limits=limits)
    assert info.value.param == param and text in info.value.message


def test_output_token_limit_caps_and_refuses():
    limits = Limits(max_output_tokens=32)
    capped = build_stage_params(served(SPEECH), route_defaults={"max_tokens": None}, limits=limits)
    assert capped[0] == {"max_tokens": 32}
    with pytest.raises(
        InvalidRequestError, match="max_tokens 33 exceeds this model's max_output_tokens of 32"
    ):
        build_stage_params(served(SPEECH), sampling={"max_tokens": 33}, limits=limits)


def test_parse_size():
    assert parse_size("640x480") == (640, 480)
    assert parse_size("auto") is None and parse_size(None) is None
    with pytest.raises(InvalidRequestError):
        parse_size("640x")
