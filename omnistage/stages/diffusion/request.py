"""A diffusion request as the engine holds it: the user's inputs resolved against the pipeline's defaults,
plus what the step path keeps between denoise steps."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from omnistage.params import DiffusionParams


@dataclasses.dataclass
class StepState:
    """Per-request denoising state for step execution: everything one denoise step reads and writes.

    `cond` / `uncond` are the request's transformer inputs for the conditional and unconditional branch
    (batched rows = the request's outputs); `uncond` is None when the request runs without CFG. The scheduler
    is a private copy, so requests at different steps never share solver history.
    """

    latents: torch.Tensor
    timesteps: torch.Tensor
    scheduler: Any
    cond: dict[str, Any]
    uncond: dict[str, Any] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    step_index: int = 0
    cache: Any = None  # per-request step-cache state (cache.py)

    @property
    def total_steps(self) -> int:
        return len(self.timesteps)

    @property
    def done(self) -> bool:
        return self.step_index >= self.total_steps

    @property
    def rows(self) -> int:
        return self.latents.shape[0]


@dataclasses.dataclass
class VideoWithAudio:
    """A clip whose model made its sound track with it (LTX-2): what such a family's `decode` (or
    `split_output`) returns, so the engine's output carries the frames and the waveform together."""

    frames: torch.Tensor  # [k, F, H, W, 3] floats in [0, 1]
    audio: torch.Tensor  # [k, C, N] float samples
    sample_rate: int


@dataclasses.dataclass
class DiffusionRequest:
    """`params` has every knob the family uses filled in (no None left for height, steps, guidance...)."""

    request_id: str
    prompt: str
    params: DiffusionParams
    images: list[Any] = dataclasses.field(default_factory=list)
    priority: int = 0
    arrival_time: float = dataclasses.field(default_factory=time.monotonic)
    # What an upstream stage hands the family's step adapter (the StageRequest's `inputs`: GLM-Image's
    # prior tokens from its AR stage); None for a request that starts here.
    inputs: Any = None
    state: StepState | None = None
    started_at: float | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def negative_prompt(self) -> str | None:
        return self.params.negative_prompt

    @property
    def num_steps(self) -> int:
        return int(self.params.num_inference_steps)

    @property
    def steps_done(self) -> int:
        return self.state.step_index if self.state is not None else 0

    def generator(self, device: str = "cpu") -> torch.Generator:
        return torch.Generator(device).manual_seed(int(self.params.seed))
