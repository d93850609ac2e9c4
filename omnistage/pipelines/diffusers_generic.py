"""Any diffusers pipeline directory (`model_index.json`) served as a one-stage DIFFUSION pipeline.

The stage's output modality follows the pipeline class: "video" for video pipelines (Wan, LTX, CogVideoX...),
"audio" for audio pipelines (Stable Audio, AudioLDM...), "image" otherwise. Families that need more than one
stage (an AR model feeding a DiT) register their own pipeline and win over this fallback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from omnistage.config.capabilities import Capabilities
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.pipelines import registry
from omnistage.stages.diffusion.modality import pipeline_modality

if TYPE_CHECKING:
    from omnistage.config.resolve import ModelInfo

DEPLOY = "diffusers_generic.yaml"


def diffusers_pipeline(class_name: str) -> PipelineSpec:
    """The one-stage pipeline for a diffusers pipeline class."""
    modality = pipeline_modality(class_name)
    stage = StageSpec(
        stage_id=0, name="dit", kind=StageKind.DIFFUSION, final_output=True, output_modality=modality
    )
    route = {"image": ("images",), "video": ("videos",), "audio": ("speech", "audio_generate")}.get(modality)
    routes = ("chat", *route) if route else ("chat",)
    length_arg = _audio_length_arg(class_name) if modality == "audio" else None
    capabilities = Capabilities(
        routes=routes, prompt="text", fields={"diffusion": (0,)}, audio_length_arg=length_arg
    )
    name = f"diffusers-{class_name}"
    return PipelineSpec(
        name=name,
        stages=(stage,),
        diffusers_classes=(class_name,),
        default_deploy=DEPLOY,
        capabilities=capabilities,
    )


def _audio_length_arg(class_name: str) -> str | None:
    """The call argument of an audio pipeline that sets the clip's length in seconds, if it has one."""
    import inspect

    import diffusers

    cls = getattr(diffusers, class_name, None)
    if cls is None:
        return None
    names = inspect.signature(cls.__call__).parameters
    return next((a for a in ("audio_end_in_s", "audio_length_in_s") if a in names), None)


def resolve(info: ModelInfo) -> PipelineSpec | None:
    return diffusers_pipeline(info.diffusers_class) if info.diffusers_class else None


# Lowest priority: a family module that registers a diffusers class itself is matched first.
registry.register_resolver("diffusers_generic", resolve, priority=-100)
