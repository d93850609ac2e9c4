"""Reads colour, shape, count, position and motion off pixels, with no learned parts.

The scenes are flat shapes on flat backgrounds, so plain measurement is enough and cannot be fooled the
way a learned classifier can: the background is the border's median colour, a pixel is foreground when it
lies more than half-way from the background to any shape colour, the colour is the nearest palette entry to
the foreground's median, and the shape is read from blur-tolerant moments (see `shape_of`). Tested on
rendered ground truth, where it must be (nearly) always right.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np

from omnistage.demo.scenes import COLOURS, POSITIONS, SIZE

MIN_AREA = 6  # pixels; smaller blobs are noise
STILL_DISTANCE = 3.0  # pixels of centroid travel below which a clip counts as still
_PALETTE_NAMES = list(COLOURS)
_PALETTE = np.asarray([COLOURS[name] for name in _PALETTE_NAMES], np.float32)


@dataclasses.dataclass(frozen=True)
class Measurement:
    colour: str | None
    shape: str | None
    count: int
    position: str | None
    centroid: tuple[float, float] | None  # (x, y) in pixels, over all foreground


def background_colour(frame: np.ndarray) -> np.ndarray:
    border = np.concatenate([frame[0], frame[-1], frame[:, 0], frame[:, -1]]).astype(np.float32)
    return np.median(border, axis=0)


def foreground_strength(frame: np.ndarray, background: np.ndarray) -> np.ndarray:
    """Per pixel, how far it lies from the background towards a shape colour (0: background, 1: shape)."""
    pixels = frame.astype(np.float32)
    offsets = _PALETTE - background  # [C, 3]
    lengths = np.maximum((offsets * offsets).sum(axis=1), 1.0)
    projections = ((pixels - background)[..., None, :] * offsets).sum(axis=-1) / lengths  # [H, W, C]
    return np.clip(projections.max(axis=-1), 0.0, 1.5)


def components(mask: np.ndarray) -> list[np.ndarray]:
    """4-connected components of a boolean mask, as arrays of (y, x) pixel coordinates, largest first."""
    seen = np.zeros_like(mask, dtype=bool)
    found = []
    height, width = mask.shape
    for start in zip(*np.nonzero(mask), strict=True):
        if seen[start]:
            continue
        seen[start] = True
        queue, members = deque([start]), []
        while queue:
            y, x = queue.popleft()
            members.append((y, x))
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < height and 0 <= nx < width and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    queue.append((ny, nx))
        found.append(np.asarray(members))
    return sorted(found, key=len, reverse=True)


def _central_moments(window: np.ndarray, direction: tuple[float, float]) -> tuple[float, float, float]:
    """Second, third and fourth central moments of the window's mass projected on `direction` (y, x)."""
    grid_y, grid_x = np.indices(window.shape, dtype=np.float64)
    weights = window / window.sum()
    projection = grid_y * direction[0] + grid_x * direction[1]
    centred = projection - (weights * projection).sum()
    return tuple(float((weights * centred**k).sum()) for k in (2, 3, 4))


def _fourth_cumulant(window: np.ndarray, directions: tuple[tuple[float, float], ...]) -> float:
    total = 0.0
    for direction in directions:
        m2, _, m4 = _central_moments(window, direction)
        total += m4 - 3 * m2 * m2
    return total


AXES = ((1.0, 0.0), (0.0, 1.0))
DIAGONALS = ((0.5**0.5, 0.5**0.5), (0.5**0.5, -(0.5**0.5)))


def shape_of(strength: np.ndarray, blob: np.ndarray) -> str:
    """Circle, square or triangle, from cumulants that blurring leaves unchanged.

    Generated shapes have soft edges, and a soft square thresholded at half strength looks like a circle, so
    the shape is read from the soft foreground mass instead. Convolving with a symmetric blur kernel adds
    its cumulants to the shape's, and a Gaussian-like kernel has (almost) no third or fourth cumulant, so:
    - a triangle (apex up) has a skewed vertical profile: third cumulant about -0.0074 h^3 (h: its height),
      zero for circles and squares;
    - a square's profile along a diagonal is less flat than along an axis: its fourth cumulant is half the
      axis one (-0.067 a^4 vs -0.133 a^4, a the half side), while a circle's is the same in all directions.
    """
    top, left = blob.min(axis=0)
    bottom, right = blob.max(axis=0) + 1
    window = np.clip(strength[max(0, top - 2) : bottom + 2, max(0, left - 2) : right + 2], 0.0, 1.0)
    window = np.where(window > 0.1, window, 0.0)  # background noise would dominate the high moments
    if _central_moments(window, (1.0, 0.0))[1] < -0.0035 * float(bottom - top) ** 3:
        return "triangle"
    axes = _fourth_cumulant(window, AXES)
    flatter_on_axes = (_fourth_cumulant(window, DIAGONALS) - axes) / max(abs(axes), 1e-9)
    return "square" if flatter_on_axes > 0.25 else "circle"


def position_of(x: float, y: float) -> str:
    column = min(2, int(3 * x / SIZE))
    row = min(2, int(3 * y / SIZE))
    target = ((column + 0.5) / 3, (row + 0.5) / 3)
    return min(
        POSITIONS, key=lambda name: sum((a - b) ** 2 for a, b in zip(POSITIONS[name], target, strict=True))
    )


def measure_frame(frame: np.ndarray) -> Measurement:
    """What one uint8 [H, W, 3] frame shows."""
    background = background_colour(frame)
    strength = foreground_strength(frame, background)
    blobs = [blob for blob in components(strength >= 0.5) if len(blob) >= MIN_AREA]
    if not blobs:
        return Measurement(None, None, 0, None, None)
    everything = np.concatenate(blobs)
    y, x = everything.mean(axis=0) + 0.5
    core = frame[tuple(blobs[0].T)].astype(np.float32)
    colour = _PALETTE_NAMES[int(((_PALETTE - np.median(core, axis=0)) ** 2).sum(axis=1).argmin())]
    return Measurement(
        colour, shape_of(strength, blobs[0]), len(blobs), position_of(x, y), (float(x), float(y))
    )


def motion_of(frames: np.ndarray) -> str:
    """left, right, up, down or still: how the foreground centroid moves from the first to the last frame."""
    first, last = measure_frame(frames[0]).centroid, measure_frame(frames[-1]).centroid
    if first is None or last is None:
        return "still"
    dx, dy = last[0] - first[0], last[1] - first[1]
    if max(abs(dx), abs(dy)) < STILL_DISTANCE:
        return "still"
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left"
    return "down" if dy > 0 else "up"
