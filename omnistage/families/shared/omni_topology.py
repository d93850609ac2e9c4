"""The omni models' topology: thinker (AR, text out) → talker (AR, codec tokens, fed the thinker's output
as it is written) → code2wav (a generation stage, audio out, fed the talker's codes as they come). Each omni
family gives its stages' processors, hooks and engines; the graph is this one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnistage.config.pipeline import Ref, StageKind, StageSpec


@dataclass(frozen=True)
class OmniParts:
    """A family's pieces of the thinker → talker → code2wav graph."""

    thinker_input: Ref
    thinker_args: dict[str, Any]  # the thinker stage's engine_args (its model loader)
    talker_input: Ref
    talker_chunk: Ref
    talker_args: dict[str, Any]  # the talker's engine_args: loader, step hooks, post-sample hook
    talker_defaults: dict[str, Any]  # the talker's sampling defaults
    code2wav_input: Ref
    code2wav_chunk: Ref
    code2wav_engine: Ref
    thinker_constraints: dict[str, Any] = field(default_factory=dict)  # what the talker needs of it


def thinker_stage(parts: OmniParts, **extra: Any) -> StageSpec:
    """The thinker alone (a checkpoint without audio output serves just this stage)."""
    return StageSpec(
        stage_id=0,
        name="thinker",
        kind=StageKind.AR,
        final_output=True,
        output_modality="text",
        input_processor=parts.thinker_input,
        engine_args=dict(parts.thinker_args),
        **extra,
    )


def omni_stages(parts: OmniParts) -> tuple[StageSpec, ...]:
    return (
        thinker_stage(parts, sampling_constraints=dict(parts.thinker_constraints)),
        StageSpec(
            stage_id=1,
            name="talker",
            kind=StageKind.AR,
            inputs=(0,),
            input_processor=parts.talker_input,
            chunk_processor=parts.talker_chunk,
            sampling_constraints={"detokenize": False},
            default_params=dict(parts.talker_defaults),
            engine_args=dict(parts.talker_args),
        ),
        StageSpec(
            stage_id=2,
            name="code2wav",
            kind=StageKind.GENERATION,
            inputs=(1,),
            final_output=True,
            output_modality="audio",
            input_processor=parts.code2wav_input,
            chunk_processor=parts.code2wav_chunk,
            engine=parts.code2wav_engine,
        ),
    )
