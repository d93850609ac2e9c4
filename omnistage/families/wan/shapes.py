"""The trained demo model (`omnistage/demo/assets/wan-shapes`): one Wan checkpoint served as images and clips.

A plain Wan directory resolves to the generic one-stage pipeline, which produces video only and whose
defaults (480x832, 81 frames) are far beyond what this 32x32 model draws. Here the same checkpoint backs two
independent entry stages: "image" (one frame) for /v1/images/generations and "video" (9 frames) for
/v1/videos; a request runs only the stage of the modality it asks for, with the model's native size filled
in when the client gives none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omnistage.config.capabilities import Capabilities, Limits
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.families.diffusers.pipeline import DEPLOY as GENERIC_DEPLOY

FAMILY = f"{__package__}:register"  # omnistage/families/registry.py

if TYPE_CHECKING:
    from omnistage.families.resolve import ModelInfo

# What the demo model (omnistage/demo: trained on 32x32 scenes) draws; the demo's trainer uses these too.
DEMO_MODEL_NAME = "wan-shapes"
SIZE = 32  # canvas side in pixels
CLIP_FRAMES = 9  # 1 + 4k frames, what the Wan VAE's 4x temporal compression needs
CLIP_FPS = 8
NATIVE_CALL: dict[str, Any] = {"height": SIZE, "width": SIZE, "num_frames": 1}
CLIP_CALL: dict[str, Any] = {"height": SIZE, "width": SIZE, "num_frames": CLIP_FRAMES}

DEMO_SHAPES_PIPELINE = PipelineSpec(
    name=DEMO_MODEL_NAME,
    stages=(
        StageSpec(
            stage_id=0,
            name="image",
            kind=StageKind.DIFFUSION,
            final_output=True,
            output_modality="image",
            default_params=dict(NATIVE_CALL),
        ),
        StageSpec(
            stage_id=1,
            name="video",
            kind=StageKind.DIFFUSION,
            final_output=True,
            output_modality="video",
            default_params={**CLIP_CALL, "fps": CLIP_FPS},
        ),
    ),
    default_deploy=GENERIC_DEPLOY,
    family=FAMILY,
    default_modalities=("image",),
    # A small margin over what the model draws (32x32, 9-frame clips): anything bigger only burns the
    # cores for noise, so it is refused at once.
    capabilities=Capabilities(
        routes=("chat", "images", "videos"),
        prompt="text",
        fields={"diffusion": (0, 1)},
        limits=Limits(
            max_width=2 * SIZE,
            max_height=2 * SIZE,
            max_pixels=4 * SIZE * SIZE,
            max_frames=4 * CLIP_FRAMES,
            max_steps=100,
        ),
    ),
)


def resolve(info: ModelInfo) -> PipelineSpec | None:
    """The demo directory by name (a Wan pipeline called `wan-shapes`); any other Wan stays generic."""
    index = info.model_index or {}
    if info.path.name == DEMO_MODEL_NAME and index.get("_class_name") == "WanPipeline":
        return DEMO_SHAPES_PIPELINE
    return None
