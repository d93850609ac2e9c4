"""Reading media out of runtime outputs, whatever container the engine used (tensor, array, list)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from omnistage.outputs import OmniRequestOutput
from omnistage.serving.media import as_mono_float32, as_uint8_hwc

DEFAULT_SAMPLE_RATE = 24000
DEFAULT_FPS = 16


def _to_numpy(value: Any) -> np.ndarray | Any:
    if hasattr(value, "detach"):
        return value.detach().to("cpu").numpy()
    return value


def iter_images(images: Any) -> Iterator[np.ndarray]:
    """HWC uint8 images from a list of images or batches ([N, H, W, 3] arrays are split)."""
    items = images if isinstance(images, list | tuple) else [images]
    for item in items:
        array = _to_numpy(item)
        if isinstance(array, np.ndarray) and array.ndim == 4:
            yield from (as_uint8_hwc(a) for a in array)
        else:
            yield as_uint8_hwc(array)


def images_of(out: OmniRequestOutput) -> list[np.ndarray]:
    return list(iter_images(out.images)) if out.images else []


def videos_of(out: OmniRequestOutput) -> list[np.ndarray]:
    """uint8 [F, H, W, 3] videos ([N, F, H, W, 3] is split)."""
    if out.video is None:
        return []
    video = _to_numpy(out.video)
    video = np.asarray(video)
    videos = list(video) if video.ndim == 5 else [video]
    return [v if v.dtype == np.uint8 else as_uint8_hwc(v) for v in videos]


def audio_of(out: OmniRequestOutput, *, delta: bool = False) -> np.ndarray | None:
    audio = out.delta_audio if delta else out.audio
    if audio is None:
        return None
    samples = as_mono_float32(audio)
    return samples if samples.size else None


def sample_rate_of(out: OmniRequestOutput) -> int:
    return int(out.sample_rate or DEFAULT_SAMPLE_RATE)


def fps_of(out: OmniRequestOutput) -> int:
    return int(out.fps or DEFAULT_FPS)
