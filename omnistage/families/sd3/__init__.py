"""Stable Diffusion 3 text to image, step by step on the diffusion engine."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.sd3.adapter import SD3Adapter
    from omnistage.stages.diffusion.adapters import register_step_adapter

    register_step_adapter("StableDiffusion3Pipeline", SD3Adapter)
    registry.add_resolver("sd3", family_resolver(FAMILY, ("StableDiffusion3Pipeline",)))
