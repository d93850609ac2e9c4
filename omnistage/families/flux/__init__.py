"""FLUX.1 text to image, step by step on the diffusion engine."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.flux import teacache
    from omnistage.families.flux.adapter import FluxAdapter
    from omnistage.stages.diffusion.adapters import register_step_adapter
    from omnistage.stages.diffusion.teacache_rules import register_teacache

    register_step_adapter("FluxPipeline", FluxAdapter)
    for transformer in teacache.TRANSFORMERS:
        register_teacache(transformer, coefficients=teacache.COEFFICIENTS)
    registry.add_resolver("flux", family_resolver(FAMILY, ("FluxPipeline",), teacache.TRANSFORMERS))
