"""The trained demo model that ships inside the package, so set-up never trains.

`demo_model_dir()` is a standard diffusers directory (WanPipeline): `DiffusionPipeline.from_pretrained`
loads it as is. It draws 32x32 scenes only, so callers must pass the native size; `NATIVE_CALL` in
`omnistage.families.wan.shapes` holds the arguments that go with it (the pipeline's own defaults,
480x832x81, would take minutes and draw noise).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.families.wan.shapes import DEMO_MODEL_NAME


def demo_model_dir() -> Path:
    """The committed pipeline directory (omnistage/demo/assets/wan-shapes)."""
    path = Path(__file__).parent / "assets" / DEMO_MODEL_NAME
    if not (path / "model_index.json").exists():
        raise FileNotFoundError(
            f"demo model missing at {path}; reinstall omnistage or rebuild it with "
            f"`omnistage demo train --output {path}`"
        )
    return path
