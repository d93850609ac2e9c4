"""Wan 2.1/2.2 (text and image to video), and the demo's `wan-shapes` checkpoint as images and clips."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.wan import shapes

    registry.add_resolver(shapes.DEMO_MODEL_NAME, shapes.resolve, priority=10)
