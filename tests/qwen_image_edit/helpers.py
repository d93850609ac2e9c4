"""What the Qwen-Image-Edit and Edit-Plus tests share: the cases, the plain pipeline call written out by hand
(the reference), and both models served by one in-process app."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi.testclient import TestClient
from PIL import Image

from tests.diffusion.helpers import plain_pipeline_at

TOLERANCE = 1e-4
# Outputs are multiples of 64 pixels (the tiny VAE downsamples 32x); 2 steps keep the tests short. Each
# image costs a VAE encode at ~1024x1024 pixels (the pipelines' size), so the cases use few.
BASE = {
    "height": 64,
    "width": 64,
    "num_inference_steps": 2,
    "max_sequence_length": 64,
    "output_format": "tensor",
}


def picture(seed: int, width: int, height: int) -> Image.Image:
    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8"))


SQUARE, WIDE, TALL = picture(0, 64, 64), picture(1, 64, 48), picture(2, 32, 64)
# Edit: a and b share a forward (text of two lengths, padded); d shares their step in a forward of its own
# (another image shape); c, another output size, takes other steps. True CFG where a negative prompt is.
EDIT_CASES = [
    ("a", "make it blue", {"seed": 1, "image": [SQUARE], "negative_prompt": "blurry"}),
    ("b", "add a small red hat to the cat", {"seed": 2, "image": [SQUARE]}),
    ("c", "a fox", {"seed": 3, "image": [WIDE], "width": 128, "negative_prompt": "dark"}),
    ("d", "paint it", {"seed": 4, "image": [TALL], "num_outputs": 2}),
]
# Edit-Plus: one or two images; b shares a's step in a forward of its own, c takes other steps.
PLUS_CASES = [
    ("a", "put the cat beside the fox", {"seed": 5, "image": [SQUARE, WIDE], "negative_prompt": "blurry"}),
    ("b", "make it blue", {"seed": 6, "image": [SQUARE]}),
    ("c", "make it tall", {"seed": 7, "image": [TALL], "height": 128, "negative_prompt": "dark"}),
]


def forward_rows(engine: Any, monkeypatch: Any) -> list[int]:
    """The rows of each transformer forward the engine runs from now on (its step adapter's `run_model`)."""
    rows: list[int] = []
    run_model = engine.adapter.run_model

    def recorded(module: Any, kwargs: dict[str, Any]) -> torch.Tensor:
        rows.append(kwargs["hidden_states"].shape[0])
        return run_model(module, kwargs)

    monkeypatch.setattr(engine.adapter, "run_model", recorded)
    return rows


def plain_pipeline(directory: Path):
    """diffusers' own pipeline class of the checkpoint (`QwenImageEditPipeline`, `QwenImageEditPlusPipeline`)
    loaded as a user loads it, with the processor its `model_index.json` names."""
    import omnistage.families.qwen_image_edit.processor  # noqa: F401  (diffusers resolves it by name)

    return plain_pipeline_at(str(directory))


def reference(directory: Path, prompt: str, fields: dict[str, Any], several: bool) -> torch.Tensor:
    """The plain pipeline call for a case's fields: its one image (Edit) or the list of them (Edit-Plus)."""
    call = {**BASE, **fields}
    call.pop("output_format")
    seed, n, images = call.pop("seed"), call.pop("num_outputs", 1), call.pop("image")
    result = plain_pipeline(directory)(
        image=images if several else images[0],
        prompt=prompt,
        generator=torch.Generator().manual_seed(seed),
        output_type="np",
        num_images_per_prompt=n,
        **call,
    )
    return torch.as_tensor(result.images)


def served(models: dict[str, Path], storage: Path) -> Iterator[TestClient]:
    """Several models on one server app, their stages inline (one app start for the module)."""
    from omnistage import AsyncOmni
    from omnistage.serving.app import create_app
    from omnistage.serving.settings import ServerSettings

    runtimes = {name: AsyncOmni(str(directory), placement="inline") for name, directory in models.items()}
    try:
        with TestClient(create_app(runtimes, ServerSettings(storage_dir=storage))) as client:
            yield client
    finally:
        for runtime in runtimes.values():
            runtime._close()


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def png_pixels(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))), dtype=np.int16)


def as_uint8(image: torch.Tensor) -> np.ndarray:
    return np.round(image[0].numpy() * 255).astype(np.int16)
