"""The hibari voice: speech on its own, and the voice of an LLM's spoken answers."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.hibari import pipeline
    from omnistage.families.llm.layer_forms import register_llm_forms

    register_llm_forms()  # the spoken chat's LLM
    registry.add(pipeline.HIBARI_TTS)
    registry.add(pipeline.SPOKEN_CHAT)
