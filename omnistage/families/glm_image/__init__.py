"""GLM-Image (Zhipu): an AR model writes image tokens a DiT renders from (pipeline.py)."""

from __future__ import annotations


def register() -> None:
    """Its pipeline (resolved by the diffusers pipeline class) and its DiT's step adapter."""
    from omnistage.families import registry
    from omnistage.families.glm_image import pipeline
    from omnistage.families.glm_image.adapter import GlmImageAdapter
    from omnistage.stages.diffusion.adapters import register_step_adapter

    register_step_adapter("GlmImagePipeline", GlmImageAdapter)
    registry.add(pipeline.GLM_IMAGE)
