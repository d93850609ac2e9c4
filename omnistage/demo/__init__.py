"""The embedded demo: tiny or small trained checkpoints built (or unpacked) locally, never downloaded."""

from __future__ import annotations

from pathlib import Path


def demo_model_dirs() -> list[Path]:
    """The models `omnistage serve` (no model given) serves, built (or converted) on first use."""
    from omnistage.demo.smollm import smollm2_dir

    return [smollm2_dir()]


def train(argv: list[str]) -> int:
    raise SystemExit("this build has no trainable demo model")
