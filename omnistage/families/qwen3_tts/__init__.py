"""Qwen3-TTS (12 Hz): text → talker codes (AR, code predictor in its post-sample hook) → waveform."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.qwen3_tts import pipeline

    registry.add(pipeline.QWEN3_TTS)
