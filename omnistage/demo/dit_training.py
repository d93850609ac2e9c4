"""Phase 2: train the DiT (and the small text encoder with it) by flow matching on frozen VAE latents.

The VAE is frozen after phase 1, so every training scene is encoded once (posterior mean, normalized by
the per-channel statistics recorded in the VAE config) and the DiT steps read latents from memory. Each step
trains on a batch of still images and a batch of clips, so one model draws both. Flow matching follows the
scheduler's convention: x_t = (1 - s) x_0 + s noise, the model predicts noise - x_0 at timestep 1000 s,
with s drawn from the same shifted distribution the scheduler uses at inference. One caption in ten is
dropped to "" (the pipeline's default negative prompt), which is what classifier-free guidance needs.
The text encoder trains along: a frozen random encoder barely separates "a red circle on a blue
background" from "a blue circle on a red background", and training it costs little.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from transformers import PreTrainedTokenizerBase, UMT5EncoderModel

from omnistage.demo.checkpoint import load_state, save_state
from omnistage.demo.dataset import clip_scenes, image_scenes, pixels
from omnistage.demo.text_conditioning import collapsed_padding, encode_captions
from omnistage.demo.vae_training import learning_rate

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DitTraining:
    steps: int = 5000
    stop_at: int | None = None  # end this run at that step, the schedule still planned for `steps`
    images_per_step: int = 16
    clips_per_step: int = 5
    lr: float = 3e-4
    warmup: int = 200
    ema_decay: float = 0.999
    caption_dropout: float = 0.1
    flow_shift: float = 2.0
    dataset_images: int = 12288
    dataset_clips: int = 3072
    seed: int = 0
    checkpoint_every: int = 200
    log_every: int = 25
    encode_batch: int = 64


@dataclasses.dataclass
class LatentSet:
    """Normalized latents [N, C, T, H, W] (float16 to halve memory) and their captions."""

    latents: torch.Tensor
    captions: list[str]

    def batch(self, rng: random.Random, size: int) -> tuple[torch.Tensor, list[str]]:
        picks = [rng.randrange(len(self.captions)) for _ in range(size)]
        return self.latents[picks].float(), [self.captions[i] for i in picks]


@torch.no_grad()
def encode_latent_sets(
    vae: AutoencoderKLWan, config: DitTraining, cache: Path | None = None
) -> tuple[LatentSet, LatentSet]:
    """Encodes the training scenes once (cached on disk: it takes minutes)."""
    if cache is not None and cache.exists():
        saved = torch.load(cache, weights_only=False)
        return LatentSet(**saved["images"]), LatentSet(**saved["clips"])
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    sets = []
    for sampler, count, per_batch in (
        (image_scenes, config.dataset_images, config.encode_batch),
        (clip_scenes, config.dataset_clips, config.encode_batch // 4),
    ):
        latents, captions = [], []
        for index in range(count // per_batch):
            scenes = sampler(config.seed + 1000, index, per_batch)
            z = vae.encode(pixels(scenes)).latent_dist.mean
            latents.append(((z - mean) / std).half())
            captions += [scene.caption for scene in scenes]
            if index % 20 == 0:
                logger.info("encoded %s batch %d/%d", sampler.__name__, index, count // per_batch)
        sets.append(LatentSet(torch.cat(latents), captions))
    if cache is not None:
        torch.save({"images": dataclasses.asdict(sets[0]), "clips": dataclasses.asdict(sets[1])}, cache)
    return sets[0], sets[1]


def sample_sigmas(generator: torch.Generator, size: int, shift: float) -> torch.Tensor:
    """Logit-normal noise levels (70%) mixed with uniform ones (30%, so both ends are trained), shifted
    the way FlowMatchEulerDiscreteScheduler shifts its inference sigmas."""
    logit_normal = torch.sigmoid(torch.randn(size, generator=generator))
    uniform = torch.rand(size, generator=generator)
    u = torch.where(torch.rand(size, generator=generator) < 0.7, logit_normal, uniform)
    return shift * u / (1 + (shift - 1) * u)


def flow_matching_loss(
    transformer: WanTransformer3DModel,
    latents: torch.Tensor,
    embeddings: torch.Tensor,
    bias: torch.Tensor,
    generator: torch.Generator,
    shift: float,
) -> torch.Tensor:
    noise = torch.randn(latents.shape, generator=generator)
    sigmas = sample_sigmas(generator, latents.shape[0], shift)
    s = sigmas.view(-1, 1, 1, 1, 1)
    noisy = (1 - s) * latents + s * noise
    with collapsed_padding(transformer, bias):
        prediction = transformer(noisy, sigmas * 1000, embeddings, return_dict=False)[0]
    return (prediction.float() - (noise - latents)).square().mean()


class Ema(torch.nn.Module):
    """Exponential moving average of a set of modules (what gets exported: it draws cleaner samples)."""

    def __init__(self, modules: dict[str, torch.nn.Module], decay: float):
        super().__init__()
        self.shadow = torch.nn.ModuleDict(
            {name: copy.deepcopy(module).eval() for name, module in modules.items()}
        )
        self.shadow.requires_grad_(False)
        self.decay = decay
        self.register_buffer("updates", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def update(self, modules: dict[str, torch.nn.Module]) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + float(self.updates)) / (10 + float(self.updates)))
        for name, module in modules.items():
            for shadow, live in zip(self.shadow[name].parameters(), module.parameters(), strict=True):
                shadow.lerp_(live.detach(), 1 - decay)


def captions_with_dropout(captions: list[str], rng: random.Random, rate: float) -> list[str]:
    return ["" if rng.random() < rate else caption for caption in captions]


def train_dit(
    transformer: WanTransformer3DModel,
    text_encoder: UMT5EncoderModel,
    tokenizer: PreTrainedTokenizerBase,
    data: tuple[LatentSet, LatentSet],
    config: DitTraining,
    workdir: Path,
    on_checkpoint: Callable[[int, Ema], None] | None = None,
) -> Ema:
    """Trains in place, resuming from `workdir/dit_state.pt`; returns the EMA weights (what to export)."""
    modules = {"transformer": transformer, "text_encoder": text_encoder}
    params = [p for module in modules.values() for p in module.parameters()]
    optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.01, betas=(0.9, 0.99))
    ema = Ema(modules, config.ema_decay)
    state = {**modules, "optimizer": optimizer, "ema": ema}
    state_path = workdir / "dit_state.pt"
    start = load_state(state_path, state)
    for module in modules.values():
        module.train()
    images, clips = data
    started, loss_sum, seen = time.time(), 0.0, 0
    stop = _StopOnSigterm()
    for step in range(start, min(config.steps, config.stop_at or config.steps)):
        rng, generator = (
            random.Random(f"{config.seed}/dit/{step}"),
            torch.Generator().manual_seed(config.seed + step),
        )
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config.lr, config.warmup, config.steps)
        total = 0.0
        for latent_set, size in ((images, config.images_per_step), (clips, config.clips_per_step)):
            latents, captions = latent_set.batch(rng, size)
            captions = captions_with_dropout(captions, rng, config.caption_dropout)
            embeddings, bias = encode_captions(tokenizer, text_encoder, captions)
            loss = flow_matching_loss(transformer, latents, embeddings, bias, generator, config.flow_shift)
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ema.update(modules)
        loss_sum, seen = loss_sum + total / 2, seen + 1
        if (step + 1) % config.log_every == 0:
            rate = (time.time() - started) / seen
            logger.info(
                "dit step %d/%d loss %.4f (%.2fs/step)", step + 1, config.steps, loss_sum / seen, rate
            )
            loss_sum, seen, started = 0.0, 0, time.time()
        if stop.requested:
            save_state(state_path, step + 1, state)
            logger.info("stopped by SIGTERM after step %d (rerun to continue)", step + 1)
            break
        if (step + 1) % config.checkpoint_every == 0 or step + 1 in (config.steps, config.stop_at):
            save_state(state_path, step + 1, state)
            if on_checkpoint is not None:
                on_checkpoint(step + 1, ema)
    stop.restore()
    return ema


class _StopOnSigterm:
    """Turns SIGTERM into "save after this step and stop": on a shared machine a long run is often stopped
    to free the cores, and the steps since the last checkpoint (minutes, under load) must not be lost."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._request)

    def _request(self, signum: int, frame: object) -> None:
        self.requested = True

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
