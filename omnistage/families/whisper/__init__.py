"""Whisper: speech in, text out (the encoder on the generation engine, the decoder on the AR engine)."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.whisper import pipeline

    registry.add(pipeline.WHISPER)
    registry.add(pipeline.WHISPER_EN)
    registry.add_resolver("whisper", pipeline.resolve)
