"""Qwen2.5-Omni: thinker (AR) → talker (AR) → code2wav (generation), from one checkpoint."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.qwen2_5_omni import pipeline
    from omnistage.stages.ar.cpu.layer_forms import LayerForm, register_layer_form

    register_layer_form(LayerForm("Qwen2_5OmniDecoderLayer", "Qwen2_5OmniAttention", ("Qwen2_5OmniRMSNorm",)))
    registry.add(pipeline.QWEN2_5_OMNI)
    registry.add(pipeline.QWEN2_5_OMNI_THINKER_ONLY)
    registry.add_resolver("qwen2_5_omni", pipeline.resolve)
