"""Dia: a dialogue script → the text encoder and the delayed-frame decoder (AR, every channel of a frame in
its post-sample hook) → DAC waveform."""

from __future__ import annotations


def register() -> None:
    """Its pipeline (families/registry.py). The decoder runs its own packed layers (decoder.py), so it
    registers no layer form."""
    from omnistage.families import registry
    from omnistage.families.dia import pipeline

    registry.add(pipeline.DIA)
