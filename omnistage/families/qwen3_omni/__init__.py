"""Qwen3-Omni: MoE thinker (AR) → MoE talker + code predictor (AR) → code2wav (generation)."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.qwen3_omni import pipeline
    from omnistage.families.qwen3_omni.deepstack import DeepStack, deepstack_kwargs
    from omnistage.stages.ar.cpu.layer_forms import register_layer_form
    from omnistage.stages.ar.extra_inputs import register_extra_input

    register_extra_input(DeepStack, deepstack_kwargs)
    for form in pipeline.LAYER_FORMS:
        register_layer_form(form)
    registry.add(pipeline.QWEN3_OMNI)
    registry.add(pipeline.QWEN3_OMNI_THINKER_ONLY)
    registry.add_resolver("qwen3_omni", pipeline.resolve)
