"""The toy family's pipelines: what it serves, on which routes, with which speech option."""

from __future__ import annotations

from typing import Annotated

import msgspec
import torch

from omnistage.config.capabilities import Capabilities, Limits, SpeechOption
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.prompts import SpeechPrompt, prompt_text
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.support.toy_stages import VOCAB
from tests.toy_family import FAMILY

SHIFT = SpeechOption(
    "toy_shift",
    Annotated[float, msgspec.Meta(ge=-1.0, le=1.0)],
    "added to every prompt embedding of the talker (the family's extra model input)",
)


def talker_input(ctx: StageInputContext) -> StageRequest:
    """The prompt's text, and the `toy_shift` option as the extra input (one row, for every prompt row)."""
    from tests.toy_family.model import ToyShift  # model code: loaded in the talker's process only

    inputs = ARInputs()
    shift = ctx.prompt.options.get("toy_shift") if isinstance(ctx.prompt, SpeechPrompt) else None
    if shift:
        inputs.extension = ToyShift(torch.full((ctx.resources.config.hidden_size,), float(shift)))
    return StageRequest(ctx.request_id, prompt=prompt_text(ctx.prompt), params=ctx.params, inputs=inputs)


def vocoder_input(ctx: StageInputContext) -> StageRequest:
    """The talker's tokens as the toy vocoder's codes (its code book is smaller than the vocabulary)."""
    codes = torch.tensor(ctx.upstream[0].token_ids) % VOCAB
    return StageRequest(ctx.request_id, params=ctx.params, inputs=GenerationInputs(codes))


TOY_SPEAKER = PipelineSpec(
    name="toy-speaker",
    stages=(
        StageSpec(
            0,
            "talker",
            StageKind.AR,
            final_output=True,
            output_modality="text",
            input_processor=talker_input,
            default_params={"temperature": 0.0},  # greedy unless asked: what the tests compare
            engine_args={"model_loader": "tests.toy_family.model:load_toy_talker"},
        ),
        StageSpec(
            1,
            "vocoder",
            StageKind.GENERATION,
            inputs=(0,),
            final_output=True,
            output_modality="audio",
            input_processor=vocoder_input,
            engine_args={"generator": "tests.support.toy_stages:make_vocoder", "outputs_per_frame": 200},
        ),
    ),
    family=FAMILY,
    default_modalities=("text",),
    capabilities=Capabilities(
        routes=("chat", "completions", "speech"),
        prompt="chat",
        fields={"sampling": (0,)},
        speech_options=(SHIFT,),
    ),
)

TOY_SD = PipelineSpec(
    name="toy-sd",
    stages=(StageSpec(0, "unet", StageKind.DIFFUSION, final_output=True, output_modality="image"),),
    family=FAMILY,
    capabilities=Capabilities(
        routes=("images",), prompt="text", fields={"diffusion": (0,)}, limits=Limits(max_steps=50)
    ),
)
