"""Stable Audio Open (text to audio), step by step on the diffusion engine (`/v1/audio/generate`, speech)."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.stable_audio.adapter import StableAudioAdapter
    from omnistage.stages.diffusion.adapters import register_step_adapter

    register_step_adapter("StableAudioPipeline", StableAudioAdapter)
    registry.add_resolver("stable_audio", family_resolver(FAMILY, ("StableAudioPipeline",)))
