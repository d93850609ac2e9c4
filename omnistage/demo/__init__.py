"""The embedded demo: tiny or small trained checkpoints built (or unpacked) locally, never downloaded."""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def demo_model_dirs() -> list[Path]:
    """The models `omnistage serve` (no model given) serves: the chat model (which also speaks its answers),
    the voice on its own, Whisper tiny.en (transcriptions), and the trained shapes model (images and clips)
    when the package carries its weights."""
    from omnistage.demo.model import demo_model_dir
    from omnistage.demo.smollm import smollm2_dir
    from omnistage.demo.voice import spoken_chat_dir, voice_dir
    from omnistage.demo.whisper import whisper_dir

    dirs = [spoken_chat_dir(smollm2_dir()), voice_dir(), whisper_dir()]
    try:
        dirs.append(demo_model_dir())
    except FileNotFoundError as exc:
        logger.warning("%s", exc)
    return dirs


def train(argv: list[str]) -> int:
    """`omnistage demo train [...]`: reproduces the shapes model from scratch (see omnistage.demo.trainer)."""
    from omnistage.demo.trainer import main

    return main(argv)
