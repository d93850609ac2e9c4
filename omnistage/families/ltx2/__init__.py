"""LTX-2 (text or an image to a video with its own sound track), step by step on the diffusion engine."""

from __future__ import annotations

FAMILY = f"{__name__}:register"  # omnistage/families/registry.py


def register() -> None:
    """Its pipelines and resolvers, and its entries in the engines' registries (families/registry.py)."""
    from omnistage.families import registry
    from omnistage.families.diffusers.pipeline import family_resolver
    from omnistage.families.ltx2.adapter import LTX2Adapter, LTX2I2VAdapter
    from omnistage.stages.diffusion.adapters import register_step_adapter

    adapters = {"LTX2Pipeline": LTX2Adapter, "LTX2ImageToVideoPipeline": LTX2I2VAdapter}
    for pipeline_class, adapter in adapters.items():
        register_step_adapter(pipeline_class, adapter)
    registry.add_resolver("ltx2", family_resolver(FAMILY, adapters))
