"""Any diffusers pipeline directory (`model_index.json`) served as a one-stage DIFFUSION pipeline.

The stage's output modality follows the pipeline class (modality.py): "video" for video pipelines (Wan,
LTX, CogVideoX...), "audio" for audio pipelines (Stable Audio, AudioLDM...), "image" otherwise; the engine
learns it from the stage. Families that need more than one stage (an AR model feeding a DiT) register their
own pipeline and win over this fallback. A family with entries in the diffusion engine's registries (step
adapters, TeaCache rules, padding processors) serves its directories with this same one-stage pipeline
under its own name (`family_resolver`), so a stage process serving one registers that family.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

from omnistage.config.capabilities import Capabilities, Limits
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.families.diffusers.modality import pipeline_modality

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py

if TYPE_CHECKING:
    from omnistage.families.resolve import ModelInfo

DEPLOY = str(HERE / "diffusers_generic.yaml")


def diffusers_pipeline(class_name: str, path: Path | None = None, family: str = FAMILY) -> PipelineSpec:
    """The one-stage pipeline for a diffusers pipeline class (the checkpoint at `path` sets limits); `family`
    is the `register` its stage processes run (this package's, or that of the family that claims it)."""
    modality = pipeline_modality(class_name)
    stage = StageSpec(
        stage_id=0, name="dit", kind=StageKind.DIFFUSION, final_output=True, output_modality=modality
    )
    route = {"image": ("images",), "video": ("videos",), "audio": ("speech", "audio_generate")}.get(modality)
    routes = ("chat", *route) if route else ("chat",)
    length_arg = _audio_length_arg(class_name) if modality == "audio" else None
    seconds = _max_audio_seconds(path) if length_arg and path else None
    capabilities = Capabilities(
        routes=routes,
        prompt="text",
        fields={"diffusion": (0,)},
        limits=Limits(max_output_audio_seconds=seconds),
        audio_length_arg=length_arg,
        diffusion_options=_diffusion_options(path) if path else (),
    )
    name = f"diffusers-{class_name}"
    return PipelineSpec(
        name=name,
        stages=(stage,),
        diffusers_classes=(class_name,),
        default_deploy=DEPLOY,
        family=family,
        capabilities=capabilities,
    )


def _diffusion_options(path: Path) -> tuple[str, ...]:
    """The model-specific knobs the checkpoint has: a scheduler with a flow shift, two experts with a
    boundary (and the low-noise expert's guidance scale)."""
    options = []
    try:
        scheduler = json.loads((path / "scheduler" / "scheduler_config.json").read_text())
        index = json.loads((path / "model_index.json").read_text())
    except (OSError, ValueError):
        return ()
    if "flow_shift" in scheduler:
        options.append("flow_shift")
    if index.get("boundary_ratio") is not None:
        options += ["boundary_ratio", "guidance_scale_2"]
    return tuple(options)


def _audio_length_arg(class_name: str) -> str | None:
    """The call argument of an audio pipeline that sets the clip's length in seconds, if it has one."""
    import inspect

    import diffusers

    cls = getattr(diffusers, class_name, None)
    if cls is None:
        return None
    names = inspect.signature(cls.__call__).parameters
    return next((a for a in ("audio_end_in_s", "audio_length_in_s") if a in names), None)


def _max_audio_seconds(path: Path) -> float | None:
    """The longest clip of a latent-audio pipeline (Stable Audio): the DiT's sample size in latent frames,
    times the VAE's hop in samples, over its sample rate; None where the checkpoint does not say."""
    try:
        transformer = json.loads((path / "transformer" / "config.json").read_text())
        vae = json.loads((path / "vae" / "config.json").read_text())
        frames, rate = transformer["sample_size"], vae["sampling_rate"]
        return frames * math.prod(vae["downsampling_ratios"]) / rate
    except (OSError, KeyError, TypeError, ValueError):
        return None


def resolve(info: ModelInfo) -> PipelineSpec | None:
    return diffusers_pipeline(info.diffusers_class, info.path) if info.diffusers_class else None


def family_resolver(
    family: str, pipelines: Collection[str] = (), transformers: Collection[str] = ()
) -> Callable[[ModelInfo], PipelineSpec | None]:
    """A resolver for the diffusers directories a family's registrations apply to: its pipeline classes (its
    step adapters), or any pipeline with one of its transformer classes (its TeaCache rules and attention
    processors serve every pipeline built on them). They get the one-stage pipeline named for `family`."""

    def resolve_family(info: ModelInfo) -> PipelineSpec | None:
        class_name = info.diffusers_class
        if not class_name:
            return None
        if class_name in pipelines or _component_classes(info) & set(transformers):
            return diffusers_pipeline(class_name, info.path, family=family)
        return None

    return resolve_family


def _component_classes(info: ModelInfo) -> set[str]:
    """The classes `model_index.json` names for its components (`"transformer": ["diffusers", "..."]`)."""
    entries = (info.model_index or {}).values()
    return {e[1] for e in entries if isinstance(e, list) and len(e) == 2 and isinstance(e[1], str)}
