"""HunyuanVideo-1.5 (text and image to video), step by step on the diffusion engine."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.hunyuan_video15.adapter import HunyuanVideo15Adapter, HunyuanVideo15I2VAdapter
    from omnistage.stages.diffusion.adapters import register_step_adapter

    adapters = {
        "HunyuanVideo15Pipeline": HunyuanVideo15Adapter,
        "HunyuanVideo15ImageToVideoPipeline": HunyuanVideo15I2VAdapter,
    }
    for pipeline_class, adapter in adapters.items():
        register_step_adapter(pipeline_class, adapter)
    registry.add_resolver("hunyuan_video15", family_resolver(FAMILY, adapters))
