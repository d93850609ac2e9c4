"""VoxCPM2 (OpenBMB): a tokenizer-free TTS speaking in continuous VAE latents (pipeline.py)."""

from __future__ import annotations


def register() -> None:
    """Its pipeline, the resolver that knows its checkpoint directory (no `architectures` in its config),
    and the decoder's extra input (which packed rows are audio positions)."""
    from omnistage.families import registry
    from omnistage.families.voxcpm2 import pipeline
    from omnistage.families.voxcpm2.decoder import VoxPrompt, audio_rows
    from omnistage.stages.ar.extra_inputs import register_extra_input

    registry.add(pipeline.VOXCPM2)
    registry.add_resolver("voxcpm2", pipeline.resolve)
    register_extra_input(VoxPrompt, audio_rows)
