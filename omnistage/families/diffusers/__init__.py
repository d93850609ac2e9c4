"""Any diffusers pipeline directory, served as one diffusion stage: step by step where a family registers
a step adapter for its class, as whole calls otherwise."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers import pipeline

    # Lowest priority: a family that serves a diffusers class itself is matched first.
    registry.add_resolver("diffusers_generic", pipeline.resolve, priority=-100)
