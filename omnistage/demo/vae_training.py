"""Phase 1: train the Wan VAE on rendered images and clips.

Every step sees fresh scenes (rendering costs nothing next to the convolutions), still images and 9-frame
clips in the same step, because the Wan VAE encodes a clip's first frame exactly as it encodes an image
and both paths must reconstruct well. A small KL term keeps the latent space smooth enough for the DiT
to land near valid latents.

Many small steps beat few large ones here: this VAE first learns flat backgrounds and only after a couple
of hundred optimizer steps starts drawing shapes, so steps, not samples, are what it needs. The
reconstruction loss weights shape pixels up and adds a squared term to L1: plain L1 favours the median,
and the median of a mostly-background batch is the background.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

import torch
from diffusers import AutoencoderKLWan

from omnistage.demo.checkpoint import load_state, save_state
from omnistage.demo.dataset import clip_scenes, image_scenes, pixels

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class VaeTraining:
    steps: int = 2500
    images_per_step: int = 8
    clips_per_step: int = 1
    lr: float = 5e-4
    warmup: int = 50
    kl_weight: float = 1e-4
    seed: int = 0
    checkpoint_every: int = 100
    log_every: int = 25


def learning_rate(step: int, peak: float, warmup: int, total: int) -> float:
    """Linear warmup, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def training_init(vae: AutoencoderKLWan, latent_gain: float = 5.0, logvar: float = -6.0) -> None:
    """Re-initializes a fresh Wan VAE so that it trains at this size.

    The Wan VAE normalizes features with an RMS norm that does not subtract the mean, followed by SiLU. At
    base width 16, PyTorch's random conv biases plus a small latent (|z| ~ 0.1) make a shared offset
    dominate every feature map: the normalized features barely depend on the input, and one noisy update
    can push them all negative, where SiLU passes nothing and the decoder collapses to a constant output
    (measured: L1 stuck at ~0.55 on three runs). Zero biases and a 5x gain on the latent projections keep
    the signal on top; starting the posterior's log-variance near -6 (instead of 0, unit noise on every
    latent) lets the decoder see the shapes from the first steps. The KL term still lets the variance grow
    wherever the decoder tolerates it.
    """
    z_dim = vae.config.z_dim
    with torch.no_grad():
        for module in vae.modules():
            if isinstance(module, torch.nn.Conv3d | torch.nn.Conv2d) and module.bias is not None:
                module.bias.zero_()
        vae.quant_conv.weight[:z_dim].mul_(latent_gain)
        vae.post_quant_conv.weight.mul_(latent_gain)
        vae.quant_conv.weight[z_dim:].mul_(0.01)
        vae.quant_conv.bias[z_dim:].fill_(logvar)


def foreground_weights(video: torch.Tensor, weight: float = 4.0) -> torch.Tensor:
    """1 on the background, 1 + `weight` on pixels away from each frame's median colour (the shapes),
    so the ~10% of pixels that carry all the meaning are not outvoted by the flat background."""
    median = video.flatten(3).median(dim=3).values[..., None, None]
    away = (video - median).abs().amax(dim=1, keepdim=True) > 0.1
    return 1.0 + weight * away.float()


def decode_unclamped(vae: AutoencoderKLWan, z: torch.Tensor) -> torch.Tensor:
    """`AutoencoderKLWan.decode` without its final clamp to [-1, 1].

    The clamp has no gradient outside the range, so one large early update that pushes the decoder's
    output past +-1 leaves those pixels stuck there for good (seen here: L1 rose to 0.55 and stayed).
    Training on the unclamped output lets the loss pull them back. Mirrors `AutoencoderKLWan._decode`
    (frame by frame through the causal cache); a test checks it equals `decode` on in-range outputs.
    """
    vae.clear_cache()
    x = vae.post_quant_conv(z)
    frames = []
    for index in range(z.shape[2]):
        vae._conv_idx = [0]
        frame = x[:, :, index : index + 1]
        frames.append(
            vae.decoder(frame, feat_cache=vae._feat_map, feat_idx=vae._conv_idx, first_chunk=index == 0)
        )
    vae.clear_cache()
    return torch.cat(frames, dim=2)


def vae_loss(vae: AutoencoderKLWan, video: torch.Tensor, kl_weight: float) -> tuple[torch.Tensor, float]:
    posterior = vae.encode(video).latent_dist
    reconstruction = decode_unclamped(vae, posterior.sample())
    error, weights = reconstruction - video, foreground_weights(video)
    reconstruction_loss = (weights * (error.abs() + error.square())).mean()
    kl = 0.5 * (posterior.mean.square() + posterior.var - 1.0 - posterior.logvar).mean()
    return reconstruction_loss + kl_weight * kl, float(error.detach().abs().mean())


def train_vae(vae: AutoencoderKLWan, config: VaeTraining, workdir: Path) -> AutoencoderKLWan:
    """Trains `vae` in place, resuming from `workdir/vae_state.pt` when present."""
    training_init(vae)
    optimizer = torch.optim.AdamW(vae.parameters(), lr=config.lr, weight_decay=0.0)
    state_path = workdir / "vae_state.pt"
    start = load_state(state_path, {"vae": vae, "optimizer": optimizer})
    vae.train()
    started, l1_sum, seen = time.time(), 0.0, 0
    for step in range(start, config.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config.lr, config.warmup, config.steps)
        images = pixels(image_scenes(config.seed, step, config.images_per_step))
        clips = pixels(clip_scenes(config.seed, step, config.clips_per_step))
        loss_images, l1_images = vae_loss(vae, images, config.kl_weight)
        loss_clips, l1_clips = vae_loss(vae, clips, config.kl_weight)
        (loss_images + loss_clips).backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        l1_sum, seen = l1_sum + (l1_images + l1_clips) / 2, seen + 1
        if (step + 1) % config.log_every == 0:
            rate = (time.time() - started) / seen
            logger.info("vae step %d/%d l1 %.4f (%.2fs/step)", step + 1, config.steps, l1_sum / seen, rate)
            l1_sum, seen, started = 0.0, 0, time.time()
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
            save_state(state_path, step + 1, {"vae": vae, "optimizer": optimizer})
    vae.eval()
    return vae


@torch.no_grad()
def latent_statistics(vae: AutoencoderKLWan, seed: int, batches: int = 8) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of posterior means over images and clips (what WanPipeline un-normalizes)."""
    latents = []
    for index in range(batches):
        for video in (pixels(image_scenes(seed + 1, index, 32)), pixels(clip_scenes(seed + 1, index, 8))):
            z = vae.encode(video).latent_dist.mean
            latents.append(z.transpose(0, 1).flatten(1))
    flat = torch.cat(latents, dim=1)
    return flat.mean(dim=1).tolist(), flat.std(dim=1).clamp_min(1e-3).tolist()
