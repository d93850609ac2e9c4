"""Qwen-Image-Edit and Qwen-Image-Edit-Plus (edits of one or several images), step by step on the diffusion
engine."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py
PIPELINES = ("QwenImageEditPipeline", "QwenImageEditPlusPipeline")


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py).

    Its resolver answers before Qwen-Image's (which claims every pipeline on the Qwen-Image transformer), so
    a stage process serving an edit model registers this family: its step adapters, Qwen-Image's TeaCache
    rule for the shared transformer, and the image-only processor its checkpoints name (processor.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.qwen_image import teacache
    from omnistage.families.qwen_image_edit import processor  # noqa: F401  (diffusers loads it by name)
    from omnistage.families.qwen_image_edit.adapter import QwenImageEditAdapter, QwenImageEditPlusAdapter
    from omnistage.stages.diffusion.adapters import register_step_adapter
    from omnistage.stages.diffusion.teacache_rules import register_teacache

    register_step_adapter("QwenImageEditPipeline", QwenImageEditAdapter)
    register_step_adapter("QwenImageEditPlusPipeline", QwenImageEditPlusAdapter)
    for transformer in teacache.TRANSFORMERS:
        register_teacache(transformer, modulated_input=teacache.modulated_input)
    registry.add_resolver("qwen_image_edit", family_resolver(FAMILY, PIPELINES), priority=1)
