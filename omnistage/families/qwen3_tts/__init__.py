"""Qwen3-TTS (12 Hz): text → talker codes (AR, code predictor in its post-sample hook) → waveform."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.llm.layer_forms import QWEN3
    from omnistage.families.qwen3_tts import pipeline
    from omnistage.stages.ar.cpu.layer_forms import register_layer_form

    register_layer_form(QWEN3)  # the talker and the code predictor are Qwen3 decoders
    registry.add(pipeline.QWEN3_TTS)
