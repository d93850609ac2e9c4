"""Plain LLMs: any `...ForCausalLM` checkpoint (Qwen2, Qwen3, Llama, ...), also from a GGUF file."""

from __future__ import annotations


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.llm import gguf_source, pipeline
    from omnistage.families.llm.layer_forms import register_llm_forms

    register_llm_forms()
    registry.add(pipeline.LLM_PIPELINE)
    registry.add_resolver("llm", pipeline.resolve_llm, priority=-100)
    registry.add_source("gguf", gguf_source.gguf_source)
