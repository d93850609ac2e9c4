"""FLUX.1 text to image, step by step on the diffusion engine."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
