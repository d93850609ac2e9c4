"""VibeVoice (Microsoft): long-form, multi-speaker TTS speaking in continuous latents (pipeline.py)."""

from __future__ import annotations


def register() -> None:
    """Its pipeline (resolved by `architectures`)."""
    from omnistage.families import registry
    from omnistage.families.vibevoice import pipeline

    registry.add(pipeline.VIBEVOICE)
