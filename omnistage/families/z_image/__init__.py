"""Z-Image (text to image), step by step on the diffusion engine."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.z_image.adapter import ZImageAdapter
    from omnistage.stages.diffusion.adapters import register_step_adapter

    register_step_adapter("ZImagePipeline", ZImageAdapter)
    registry.add_resolver("z_image", family_resolver(FAMILY, ("ZImagePipeline",)))
