"""Scores a demo pipeline on captions it never saw in training, and measures its step-caching behaviour.

- images: one held-out (colour, shape, position) caption per scene, generated with the pipeline's own
  defaults for steps and guidance (50, 5.0) at 32x32; colour, shape, position and count are read off the
  pixels by `measure`.
- clips: held-out (colour, shape, direction) captions at 9 frames; the motion is the centroid's travel.
- cache: cache-dit DBCache at its defaults on 20-step generations: the fraction of transformer calls served
  from cache, the PSNR of the cached images against the uncached ones (same seeds), and the per-step
  change of the residual DBCache compares.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import DiffusionPipeline

from omnistage.demo.measure import measure_frame, motion_of
from omnistage.demo.scenes import SIZE, Scene, evaluation_clip_scenes, evaluation_image_scenes

logger = logging.getLogger(__name__)

PIPELINE_DEFAULT_STEPS = 50  # WanPipeline.__call__'s default num_inference_steps
PIPELINE_DEFAULT_GUIDANCE = 5.0  # and its default guidance_scale
CACHE_STEPS = 20


def generate(
    pipe: DiffusionPipeline,
    captions: list[str],
    num_frames: int,
    steps: int = PIPELINE_DEFAULT_STEPS,
    guidance_scale: float = PIPELINE_DEFAULT_GUIDANCE,
    seed: int = 0,
    batch_size: int = 16,
) -> np.ndarray:
    """uint8 [N, F, H, W, 3]; caption i always gets the generator seeded `seed + i`, whatever the batching."""
    pipe.set_progress_bar_config(disable=True)
    videos = []
    for start in range(0, len(captions), batch_size):
        chunk = captions[start : start + batch_size]
        generators = [torch.Generator().manual_seed(seed + start + i) for i in range(len(chunk))]
        frames = pipe(
            chunk,
            height=SIZE,
            width=SIZE,
            num_frames=num_frames,
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            generator=generators,
            output_type="np",
        ).frames
        videos.append(np.clip(np.rint(np.asarray(frames) * 255), 0, 255).astype(np.uint8))
    return np.concatenate(videos)


def score_images(frames: np.ndarray, scenes: list[Scene]) -> dict[str, float]:
    """Fractions of images whose measured colour / shape / position / count match their caption."""
    hits = {"colour": 0, "shape": 0, "position": 0, "count": 0}
    for video, scene in zip(frames, scenes, strict=True):
        seen, truth = measure_frame(video[0]), scene.shapes[0]
        hits["colour"] += seen.colour == truth.colour
        hits["shape"] += seen.shape == truth.kind
        hits["position"] += seen.position == scene.position
        hits["count"] += seen.count == len(scene.shapes)
    return {name: value / len(scenes) for name, value in hits.items()}


def score_clips(frames: np.ndarray, scenes: list[Scene]) -> dict[str, float]:
    """Fractions of clips that move the stated way, and whose middle frame has the stated colour / shape."""
    hits = {"motion": 0, "colour": 0, "shape": 0}
    for video, scene in zip(frames, scenes, strict=True):
        middle, truth = measure_frame(video[len(video) // 2]), scene.shapes[0]
        hits["motion"] += motion_of(video) == scene.direction
        hits["colour"] += middle.colour == truth.colour
        hits["shape"] += middle.shape == truth.kind
    return {name: value / len(scenes) for name, value in hits.items()}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0**2 / mse)


def held_out_scenes(seeds: int) -> tuple[list[Scene], list[Scene]]:
    images = [scene for seed in range(seeds) for scene in evaluation_image_scenes(seed)]
    clips = [scene for seed in range(seeds) for scene in evaluation_clip_scenes(seed)]
    return images, clips


def quality_report(
    pipe: DiffusionPipeline, seeds: int = 2, steps: int = PIPELINE_DEFAULT_STEPS
) -> dict[str, Any]:
    images, clips = held_out_scenes(seeds)
    image_frames = generate(pipe, [s.caption for s in images], num_frames=1, steps=steps)
    clip_frames = generate(pipe, [s.caption for s in clips], num_frames=clips[0].num_frames, steps=steps)
    return {
        "steps": steps,
        "guidance_scale": PIPELINE_DEFAULT_GUIDANCE,
        "images": {"n": len(images), **score_images(image_frames, images)},
        "clips": {"n": len(clips), **score_clips(clip_frames, clips)},
    }


class FrontResidualRecorder:
    """Records, per transformer call, what DBCache compares between steps: the residual the first
    `front_blocks` blocks add to the hidden states (its `Fn` residual)."""

    def __init__(self, transformer: torch.nn.Module, front_blocks: int) -> None:
        self.residuals: list[torch.Tensor] = []
        blocks = transformer.blocks
        self._hooks = [
            blocks[0].register_forward_pre_hook(self._entering, with_kwargs=True),
            blocks[front_blocks - 1].register_forward_hook(self._leaving),
        ]

    def _entering(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self._input = (args[0] if args else kwargs["hidden_states"]).detach().clone()

    def _leaving(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        self.residuals.append(output.detach() - self._input)

    def step_changes(self) -> list[float]:
        """Relative L1 change of the conditional calls' residual from each step to the next (the calls
        alternate conditional / unconditional under guidance, as DBCache's separate-CFG mode sees them)."""
        cond = self.residuals[0::2]
        return [float((b - a).abs().mean() / a.abs().mean()) for a, b in zip(cond, cond[1:], strict=False)]

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


def cache_report(
    pipe_dir: Path, captions: list[str], num_frames: int = 1, steps: int = CACHE_STEPS
) -> dict[str, Any]:
    """DBCache at its defaults vs no cache, one caption per call (what one request sees).

    Also reports, step by step, how much the residual DBCache compares changes between consecutive
    uncached steps: DBCache reuses a step when that change, measured against the last computed step,
    stays under its threshold, so this profile says why a model caches as much as it does."""
    import cache_dit

    plain = DiffusionPipeline.from_pretrained(pipe_dir)
    reference, changes = [], []
    for i, caption in enumerate(captions):
        recorder = FrontResidualRecorder(plain.transformer, cache_dit.DBCacheConfig().Fn_compute_blocks)
        try:
            reference.append(generate(plain, [caption], num_frames, steps=steps, seed=i))
            changes.append(recorder.step_changes())
        finally:
            recorder.close()
    cached_pipe = DiffusionPipeline.from_pretrained(pipe_dir)
    cache_dit.enable_cache(cached_pipe, cache_config=cache_dit.DBCacheConfig())
    fractions, scores = [], []
    for i, caption in enumerate(captions):
        output = generate(cached_pipe, [caption], num_frames, steps=steps, seed=i)
        stats = cache_dit.summary(cached_pipe, logging=False)[0]
        calls = stats.accumulated_transformer_executed_steps or stats.accumulated_executed_steps
        fractions.append((len(stats.cached_steps) + len(stats.cfg_cached_steps)) / max(1, calls))
        scores.append(psnr(output, reference[i]))
    finite = [s for s in scores if math.isfinite(s)]
    return {
        "steps": steps,
        "num_frames": num_frames,
        "n": len(captions),
        "config": "DBCacheConfig() defaults: F8B0, threshold 0.08, 8 warmup steps",
        "cached_fraction_mean": float(np.mean(fractions)),
        "cached_fraction_min": float(np.min(fractions)),
        "psnr_db_mean": float(np.mean(finite)) if finite else math.inf,
        "psnr_db_min": float(np.min(finite)) if finite else math.inf,
        "front_residual_change_by_step": [round(float(x), 3) for x in np.mean(changes, axis=0)],
    }


def evaluate_pipeline_dir(pipe_dir: Path, quick: bool = False) -> dict[str, Any]:
    """The full report `omnistage demo train` prints (quick: a smoke run for tests)."""
    pipe = DiffusionPipeline.from_pretrained(pipe_dir)
    images, clips = held_out_scenes(1)
    if quick:
        return {"quality": quality_report(pipe, seeds=1, steps=2)}
    report = {"quality": quality_report(pipe), "quality_20_steps": quality_report(pipe, steps=CACHE_STEPS)}
    report["cache_images"] = cache_report(pipe_dir, [s.caption for s in images])
    report["cache_clips"] = cache_report(pipe_dir, [s.caption for s in clips], num_frames=clips[0].num_frames)
    return report
