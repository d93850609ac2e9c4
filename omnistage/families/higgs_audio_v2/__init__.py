"""Higgs Audio v2 (Boson AI): a Llama 3 decoder with DualFFN layers writing 8 codebooks a frame in a delay
pattern (AR, every codebook picked in its post-sample hook) → its codec's DAC decoder (generation)."""


def register() -> None:
    """Its pipeline, and its entry in the AR engine's extra inputs (the DualFFN layers' audio mask)."""
    from omnistage.families import registry
    from omnistage.families.higgs_audio_v2 import pipeline, talker

    talker.register()
    registry.add(pipeline.HIGGS_AUDIO_V2)
