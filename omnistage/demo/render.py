"""Rasterizes scenes into uint8 frames.

Shapes are drawn with 4x supersampling so their edges are anti-aliased: a VAE learns smooth edges faster
than staircase ones, and the measured fill ratio of a shape (what the evaluator reads) stays stable.
"""

from __future__ import annotations

import numpy as np

from omnistage.demo.scenes import BACKGROUNDS, CLIP_TRAVEL, COLOURS, DIRECTIONS, SIZE, Scene, Shape

SUPERSAMPLE = 4


def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    fine = (np.arange(size * SUPERSAMPLE) + 0.5) / SUPERSAMPLE
    return np.meshgrid(fine, fine)  # (x, y) in pixel units, each [size*S, size*S]


def coverage(kind: str, x: float, y: float, radius: float, size: int = SIZE) -> np.ndarray:
    """Fraction of each pixel covered by the shape, float32 [size, size]."""
    gx, gy = _grid(size)
    dx, dy = gx - x, gy - y
    if kind == "circle":
        inside = dx * dx + dy * dy <= radius * radius
    elif kind == "square":
        half = 0.85 * radius  # same visual weight as the circle
        inside = (np.abs(dx) <= half) & (np.abs(dy) <= half)
    elif kind == "triangle":
        # Upright isosceles triangle filling the lower half of its 2r x 2r box diagonally.
        depth = (dy + radius) / (2 * radius)  # 0 at the apex, 1 at the base
        inside = (depth >= 0) & (depth <= 1) & (np.abs(dx) <= depth * radius)
    else:
        raise ValueError(f"unknown shape kind {kind!r}; expected circle, square or triangle")
    fine = inside.astype(np.float32).reshape(size, SUPERSAMPLE, size, SUPERSAMPLE)
    return fine.mean(axis=(1, 3))


def _paint(canvas: np.ndarray, shape: Shape, x: float, y: float) -> None:
    alpha = coverage(shape.kind, x, y, shape.radius, canvas.shape[0])[..., None]
    canvas *= 1.0 - alpha
    canvas += alpha * np.asarray(COLOURS[shape.colour], np.float32)


def frame_offset(scene: Scene, frame: int) -> tuple[float, float]:
    """Where the shapes are in `frame` relative to the clip's middle frame (zero for still images)."""
    if not scene.direction:
        return 0.0, 0.0
    dx, dy = DIRECTIONS[scene.direction]
    progress = frame / (scene.num_frames - 1) - 0.5
    return dx * CLIP_TRAVEL * progress, dy * CLIP_TRAVEL * progress


def render(scene: Scene) -> np.ndarray:
    """The scene as uint8 frames [F, H, W, 3] (F = 1 for still images)."""
    frames = []
    for index in range(scene.num_frames):
        canvas = np.empty((SIZE, SIZE, 3), np.float32)
        canvas[:] = BACKGROUNDS[scene.background]
        ox, oy = frame_offset(scene, index)
        for shape in scene.shapes:
            _paint(canvas, shape, shape.x + ox, shape.y + oy)
        frames.append(canvas)
    return np.clip(np.rint(np.stack(frames)), 0, 255).astype(np.uint8)


def to_model_input(frames: list[np.ndarray]) -> np.ndarray:
    """uint8 clips [F, H, W, 3] (same F) -> float32 [B, 3, F, H, W] in [-1, 1], the VAE's input layout."""
    video = np.stack(frames).astype(np.float32) / 127.5 - 1.0
    return np.ascontiguousarray(video.transpose(0, 4, 1, 2, 3))
