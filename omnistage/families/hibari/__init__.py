"""The hibari voice: speech on its own, and the voice of an LLM's spoken answers."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.hibari import pipeline

    registry.add(pipeline.HIBARI_TTS)
    registry.add(pipeline.SPOKEN_CHAT)
