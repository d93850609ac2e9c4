"""FLUX.2 Klein (text to image, and edits of reference images), step by step on the diffusion engine."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.flux2.adapter import Flux2KleinAdapter
    from omnistage.stages.diffusion.adapters import register_step_adapter

    register_step_adapter("Flux2KleinPipeline", Flux2KleinAdapter)
    registry.add_resolver("flux2", family_resolver(FAMILY, ("Flux2KleinPipeline",)))
