"""The trained demo model that ships inside the package, so set-up never trains.

`demo_model_dir()` is a standard diffusers directory (WanPipeline): `DiffusionPipeline.from_pretrained`
loads it as is. It draws 32x32 scenes only, so callers must pass the native size; `NATIVE_CALL` holds the
arguments that go with it (the pipeline's own defaults, 480x832x81, would take minutes and draw noise).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.demo.scenes import CLIP_FRAMES, SIZE

DEMO_MODEL_NAME = "wan-shapes"
NATIVE_CALL: dict[str, Any] = {"height": SIZE, "width": SIZE, "num_frames": 1}
CLIP_CALL: dict[str, Any] = {"height": SIZE, "width": SIZE, "num_frames": CLIP_FRAMES}
CLIP_FPS = 8


def demo_model_dir() -> Path:
    """The committed pipeline directory (omnistage/demo/assets/wan-shapes)."""
    path = Path(__file__).parent / "assets" / DEMO_MODEL_NAME
    if not (path / "model_index.json").exists():
        raise FileNotFoundError(
            f"demo model missing at {path}; reinstall omnistage or rebuild it with "
            f"`omnistage demo train --output {path}`"
        )
    return path
