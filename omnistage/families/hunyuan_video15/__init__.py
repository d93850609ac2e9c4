"""HunyuanVideo-1.5 (text to video), step by step on the diffusion engine."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.hunyuan_video15.adapter import HunyuanVideo15Adapter
    from omnistage.stages.diffusion.adapters import register_step_adapter

    register_step_adapter("HunyuanVideo15Pipeline", HunyuanVideo15Adapter)
    registry.add_resolver("hunyuan_video15", family_resolver(FAMILY, ("HunyuanVideo15Pipeline",)))
