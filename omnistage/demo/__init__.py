"""The embedded demo: tiny or small trained checkpoints built (or unpacked) locally, never downloaded."""

from __future__ import annotations

from pathlib import Path


def demo_model_dirs() -> list[Path]:
    """The models `omnistage serve` (no model given) serves, built on first use."""
    from omnistage.demo.llm import build_demo_llm

    return [build_demo_llm()]


def train(argv: list[str]) -> int:
    raise SystemExit("this build has no trainable demo model")
