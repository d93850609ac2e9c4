"""Sesame CSM: speaker-tagged text (and earlier turns' audio) → backbone codes (AR, the depth decoder in its
post-sample hook) → Mimi waveform."""

from __future__ import annotations

from omnistage.stages.ar.cpu.layer_forms import LayerForm

# CSM's backbone and depth decoder layers are Llama's under CSM's names
CSM_LAYERS = LayerForm("CsmDecoderLayer", "CsmAttention", ("CsmRMSNorm",))


def register() -> None:
    """Its pipeline, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.csm import pipeline
    from omnistage.stages.ar.cpu.layer_forms import register_layer_form

    register_layer_form(CSM_LAYERS)
    registry.add(pipeline.CSM)
