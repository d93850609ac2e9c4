"""The flow-matching set-up FLUX.1 and Qwen-Image share (their pipelines copy it from one another in
diffusers): the resolution-dependent shift of the schedule, and the guidance embedding."""

from __future__ import annotations

from typing import Any

import torch

FLUX_SHIFT = (256, 4096, 0.5, 1.15)  # base / max image sequence length, base / max shift: a config's defaults


def shifted_timesteps(
    adapter: Any, image_seq_len: int, steps: int, sigmas: Any, defaults: tuple = FLUX_SHIFT
) -> tuple[Any, torch.Tensor]:
    """(a private scheduler set for `steps` steps, its timesteps), the shift `mu` computed from the image's
    sequence length and the scheduler's config as the pipelines' `__call__` does (`defaults`: the pipeline's
    own for the keys a config lacks)."""
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

    cfg = adapter.pipe.scheduler.config
    keys = ("base_image_seq_len", "max_image_seq_len", "base_shift", "max_shift")
    mu = calculate_shift(image_seq_len, *(cfg.get(k, d) for k, d in zip(keys, defaults, strict=True)))
    scheduler = adapter.private_scheduler()
    timesteps, _ = retrieve_timesteps(scheduler, steps, adapter.device, sigmas=sigmas, mu=mu)
    scheduler.set_begin_index(0)
    return scheduler, timesteps


def guidance_embedding(adapter: Any, scale: float, rows: int) -> torch.Tensor | None:
    """The distilled guidance scale each image row is given, for a transformer with `guidance_embeds`."""
    if not adapter.pipe.transformer.config.guidance_embeds:
        return None
    return torch.full([1], scale, device=adapter.device, dtype=torch.float32).expand(rows)
