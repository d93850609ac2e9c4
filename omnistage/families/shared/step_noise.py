"""Per-request, per-step noise for a diffusion / flow head inside an AR step.

A continuous head (a latent TTS's flow matcher) draws fresh noise every step. Drawn from one shared generator,
a request's latents would depend on what else ran in the batch and on preemption; drawn here, step `k` of
a request seeded `seed` always gets the same noise, whatever it is batched with and however often the step is
retried."""

from __future__ import annotations

import torch

_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: consecutive seeds and steps land far apart


def step_noise(
    seed: int, step: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Standard normal noise of `shape` for step `step` of a request seeded `seed` (on the CPU)."""
    key = (int(seed) * _MIX + int(step)) % (2**63 - 1)
    generator = torch.Generator().manual_seed(key)
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(dtype)
