"""The VoxCPM2 reference, the `voxcpm` package's `VoxCPM2Model` (`from_local`, `generate`), called as its
users call it, with the flow matcher's noise replaced by omnistage's per-request, per-step noise
(`same_noise`: the reference draws it from the global torch RNG, one draw a patch), and the prompts the
VoxCPM2 tests share."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from omnistage.families.shared.step_noise import step_noise
from omnistage.families.voxcpm2.tiny import tiny_voxcpm2_dir

PROMPTS = [
    "Hello there, a test!",
    "The quick brown fox jumps over the lazy dog.",
    "A small model learned to speak.",
    "How are you today?",
]
MAX_NEW = 30  # patches: prompts 0, 2, 3 stop on their own with seeds 7, 9, 10, prompt 1 at the limit
SEEDS = [7, 8, 9, 10]


@functools.cache
def reference_model() -> Any:
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    return VoxCPM2Model.from_local(str(tiny_voxcpm2_dir()), optimize=False, device="cpu")


class _Noise:
    """`torch` as the reference's flow matcher sees it, with `randn` giving step k's noise of `seed`."""

    def __init__(self, seed: int):
        self.seed, self.step = seed, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def randn(self, shape: Any, device: Any = None, dtype: Any = None) -> torch.Tensor:
        out = step_noise(self.seed, self.step, tuple(shape[1:]))[None].to(dtype)
        self.step += 1
        return out


@contextlib.contextmanager
def same_noise(seed: int) -> Iterator[None]:
    import voxcpm.modules.locdit.unified_cfm as cfm

    saved, cfm.torch = cfm.torch, _Noise(seed)
    try:
        yield
    finally:
        cfm.torch = saved


def reference_audio(text: str, seed: int, max_len: int = MAX_NEW, **kwargs: Any) -> torch.Tensor:
    """`VoxCPM2Model.generate` (min_len 2, 10 steps, guidance 2.0: its defaults) with our noise: [samples]."""
    model = reference_model()
    with same_noise(seed), torch.inference_mode():
        return model.generate(text, max_len=max_len, **kwargs).reshape(-1)


def reference_latents(text: str, seed: int, max_len: int = MAX_NEW) -> torch.Tensor:
    """The patches [T, P, D] `generate` makes for `text` (zero-shot), through its `_inference`."""
    model = reference_model()
    ids = torch.LongTensor([*model.text_tokenizer(text), model.audio_start_token])
    size, dim = model.patch_size, model.feat_dim
    length = len(ids)
    text_mask, audio_mask = (
        torch.ones(1, length, dtype=torch.int32),
        torch.zeros(1, length, dtype=torch.int32),
    )
    limit = min(int(len(model.text_tokenizer(text)) * 6.0 + 10), max_len)
    with same_noise(seed):
        _, patches = model.inference(
            ids[None], text_mask, torch.zeros(1, length, size, dim), audio_mask, min_len=2, max_len=limit
        )
    return patches


def clip(seconds: float = 0.3, pitch: float = 140.0, rate: int = 16000) -> np.ndarray:
    """A voiced-like signal (harmonics under a syllable envelope), at the VAE's input rate."""
    t = np.arange(int(rate * seconds)) / rate
    tone = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
    return (0.2 * tone * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)
