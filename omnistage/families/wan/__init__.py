"""Wan 2.1/2.2 (text and image to video), and the demo's `wan-shapes` checkpoint as images and clips."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.wan import shapes, teacache
    from omnistage.families.wan.adapter import WanI2VAdapter, WanT2VAdapter
    from omnistage.stages.diffusion import text_padding
    from omnistage.stages.diffusion.adapters import register_step_adapter
    from omnistage.stages.diffusion.teacache_rules import register_teacache

    adapters = {"WanPipeline": WanT2VAdapter, "WanImageToVideoPipeline": WanI2VAdapter}
    for pipeline_class, adapter in adapters.items():
        register_step_adapter(pipeline_class, adapter)
    for transformer in teacache.TRANSFORMERS:
        register_teacache(transformer, modulated_input=teacache.modulated_input)
    text_padding.register_padding_processor(
        "diffusers.models.transformers.transformer_wan:WanAttnProcessor",
        "omnistage.families.wan.text_padding:PaddedPromptProcessor",
    )
    registry.add_resolver(shapes.DEMO_MODEL_NAME, shapes.resolve, priority=10)
    registry.add_resolver("wan", family_resolver(FAMILY, adapters, teacache.TRANSFORMERS))
