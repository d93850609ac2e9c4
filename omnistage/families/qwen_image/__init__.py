"""Qwen-Image text to image, step by step on the diffusion engine."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.qwen_image import teacache
    from omnistage.families.qwen_image.adapter import QwenImageAdapter
    from omnistage.stages.diffusion.adapters import register_step_adapter
    from omnistage.stages.diffusion.teacache_rules import register_teacache

    register_step_adapter("QwenImagePipeline", QwenImageAdapter)
    for transformer in teacache.TRANSFORMERS:
        register_teacache(transformer, modulated_input=teacache.modulated_input)
    registry.add_resolver(
        "qwen_image", family_resolver(FAMILY, ("QwenImagePipeline",), teacache.TRANSFORMERS)
    )
