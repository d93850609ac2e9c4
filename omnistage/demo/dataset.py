"""Training batches drawn from the procedural scenes.

A batch is a pure function of (seed, batch index), so a resumed run sees exactly the batches the
interrupted one would have seen, and nothing about the data needs saving in a checkpoint.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from omnistage.demo.render import render, to_model_input
from omnistage.demo.scenes import (
    Scene,
    held_out_motions,
    held_out_placements,
    sample_clip_scene,
    sample_image_scene,
)


def batch_rng(seed: int, index: int, stream: str) -> random.Random:
    return random.Random(f"{seed}/{stream}/{index}")


def image_scenes(seed: int, index: int, count: int) -> list[Scene]:
    rng, held_out = batch_rng(seed, index, "image"), held_out_placements()
    return [sample_image_scene(rng, held_out) for _ in range(count)]


def clip_scenes(seed: int, index: int, count: int) -> list[Scene]:
    rng, held_out = batch_rng(seed, index, "clip"), held_out_motions()
    return [sample_clip_scene(rng, held_out) for _ in range(count)]


def pixels(scenes: list[Scene]) -> torch.Tensor:
    """Rendered scenes (same frame count) as float32 [B, 3, F, H, W] in [-1, 1]."""
    return torch.from_numpy(to_model_input([render(scene) for scene in scenes]))


def flip_colours(video: torch.Tensor) -> np.ndarray:
    """float [B, 3, F, H, W] in [-1, 1] -> uint8 [B, F, H, W, 3], the layout images are saved in."""
    frames = ((video.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(0, 2, 3, 4, 1).numpy()
