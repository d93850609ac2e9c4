"""Janus-Pro (DeepSeek): an LM that writes image tokens a VQ-VAE renders (pipeline.py)."""

from __future__ import annotations


def register() -> None:
    """Its pipeline (resolved by `architectures`)."""
    from omnistage.families import registry
    from omnistage.families.janus import pipeline

    registry.add(pipeline.JANUS)
