"""What a diffusers pipeline class produces, from its name alone (no diffusers import: the registry's resolver
runs this on every model directory it is asked about)."""

from __future__ import annotations

VIDEO_FAMILIES = (
    "Wan",
    "LTX",
    "CogVideoX",
    "HunyuanVideo",
    "Mochi",
    "Allegro",
    "Latte",
    "SkyReels",
    "EasyAnimate",
    "ConsisID",
    "Helios",
    "AnimateDiff",
    "I2VGenXL",
    "TextToVideo",
    "StableVideoDiffusion",
)
AUDIO_MARKERS = ("Audio", "MusicLDM")


def pipeline_modality(class_name: str) -> str:
    """ "video", "audio" or "image" for a `model_index.json` `_class_name`."""
    if any(marker in class_name for marker in AUDIO_MARKERS):
        return "audio"
    if "Video" in class_name or class_name.startswith(VIDEO_FAMILIES):
        return "video"
    return "image"
