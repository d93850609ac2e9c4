"""The VAE stage: VoxCPM2's causal AudioVAE decoder behind the generation engine.

Frames in are latent patches [T, P, D] (the decoder stage's `latents`); audio out is `P x hop` samples a
patch at the VAE's output rate. Full handoff decodes a request in one pass, as the reference
(`AudioVAEV2.decode` of every patch; a continued clip's last patches decoded as context and cut). Async
chunk continues each request's stream by default: the decoder is causal, so each chunk is decoded alone with
the convolutions' carried inputs from the chunks before it (the reference's own `StreamingVAEDecoder`, its
state kept per request), joining into the one-pass waveform with no context decoded twice; or, with
`left_context_frames: exact`, behind its exact left context (`context_patches`, found by probing the loaded
decoder).
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator as Steps
from pathlib import Path
from typing import Any

import torch

from omnistage.families.shared.codec_stage import CodecArgs, codec_engine
from omnistage.stages.base import EngineContext
from omnistage.stages.generation.engine import (
    GenerationBatch,
    GenerationEngine,
    WindowDone,
    generate_by_window,
)


def load_vae(model_dir: str | Path, device: str = "cpu") -> Any:
    """The checkpoint's AudioVAE (float32, as the reference runs it)."""
    from safetensors.torch import load_file
    from voxcpm.modules.audiovae import AudioVAEConfigV2, AudioVAEV2

    config = json.loads((Path(model_dir) / "config.json").read_text()).get("audio_vae_config")
    vae = AudioVAEV2(config=AudioVAEConfigV2(**config)) if config else AudioVAEV2()
    # not strict, as `from_local` loads it (a checkpoint may leave layers at their init)
    vae.load_state_dict(load_file(str(Path(model_dir) / "audiovae.safetensors")), strict=False)
    # Weight norm folded into the weights once: the reference recomputes each conv's weight from (g, v) on
    # every call, the same arithmetic (outputs bit-equal), which chunked decoding would pay a call a chunk.
    for module in vae.decoder.modules():
        if hasattr(module, "weight_g"):
            torch.nn.utils.remove_weight_norm(module)
        if type(module).__name__ == "Snake1d":
            module.forward = _snake(module)
    return vae.to(device).float().eval()


def _snake(module: torch.nn.Module) -> Any:
    """The reference's Snake activation, x + sin(alpha x)^2 / (alpha + 1e-9), in the same operations and
    order (bit-equal) but into one buffer: its five fresh full-size tensors a call are most of the VAE's
    memory traffic at 48 kHz (40% of a decode; this one is 3x faster, benchmarks/RESULTS.md)."""

    def forward(x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(shape[0], shape[1], -1)
        alpha = module.alpha
        y = torch.mul(alpha, x)
        y.sin_()
        y.mul_(y)
        y.mul_((alpha + 1e-9).reciprocal())
        return y.add_(x).reshape(shape)

    return forward


def patch_size(model_dir: str | Path) -> int:
    return int(json.loads((Path(model_dir) / "config.json").read_text()).get("patch_size", 4))


@torch.inference_mode()
def context_patches(vae: Any, patch: int) -> int:
    """The patches before a chunk that its samples depend on: the decoder is causal, so a latent frame
    poked at the start of a silent input changes the output up to the receptive field's end and no
    further; found on the loaded decoder itself (the layer arithmetic stays in the VAE's code)."""
    dim, hop = int(vae.latent_dim), int(vae.decode_chunk_size)
    frames = 16
    while True:
        x = torch.zeros(1, dim, frames, device=next(vae.parameters()).device)
        base = vae.decode(x)
        x[..., 0] = 1.0
        changed = (vae.decode(x) - base).abs().reshape(frames, hop).amax(dim=-1) > 0
        reach = int(changed.nonzero().max())
        if reach < frames - 1:
            return math.ceil(reach / patch)
        frames *= 2


class VoxVAEGenerator:
    """`generate(windows, params[, stream_ids])`: one waveform [T * P * hop] per [T, P, D] window of latent
    patches; with stream ids, each window continues its stream (the engine's `streams`)."""

    def __init__(self, vae: Any, patch: int):
        from voxcpm.modules.audiovae.audio_vae_v2 import StreamingVAEDecoder

        self.vae, self.patch = vae, patch
        self.sample_rate = int(vae.out_sample_rate)
        self.outputs_per_frame = patch * int(vae.decode_chunk_size)
        self.streaming = StreamingVAEDecoder(vae)
        self.streams: dict[str, dict] = {}  # stream id → the decoder's carried conv inputs

    def run(self, batch: GenerationBatch) -> Steps[WindowDone, None, list[torch.Tensor]]:
        """A window a unit, each sent as soon as it is decoded."""
        return generate_by_window(self.generate, batch)

    def generate(
        self, windows: list[torch.Tensor], params: list[Any], stream_ids: list[str] | None = None
    ) -> list[torch.Tensor]:
        device = next(self.vae.parameters()).device
        out = []
        with torch.inference_mode():
            for i, window in enumerate(windows):
                if window.shape[0] == 0:
                    out.append(torch.empty(0))
                    continue
                # [T, P, D] → [1, D, T * P]
                latents = window.to(device, torch.float32).reshape(-1, window.shape[-1]).T[None]
                if stream_ids is None:
                    wave = self.vae.decode(latents)
                else:
                    wave = self._continue(stream_ids[i], latents)
                out.append(wave.reshape(-1).float().cpu())
        return out

    def _continue(self, stream_id: str, latents: torch.Tensor) -> torch.Tensor:
        """Decode `latents` after the stream's earlier chunks: the reference's streaming decoder (its convs
        patched to carry their last inputs) with this stream's carried inputs swapped in and back out."""
        with self.streaming as decoder:
            decoder._states.update(self.streams.get(stream_id, {}))
            wave = decoder.decode_chunk(latents)
            self.streams[stream_id] = dict(decoder._states)
        return wave

    def end_stream(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)


def create_engine(ctx: EngineContext) -> GenerationEngine:
    """The VAE decoder on the generation engine, sized by `CodecArgs` (shared/codec_stage.py): chunks continue
    each request's stream ("stream", the default) or are decoded behind their exact left context ("exact");
    `async_chunk: false` decodes each request in one pass."""
    vae = load_vae(ctx.model_dir, ctx.device)
    patch = patch_size(ctx.model_dir)
    return codec_engine(ctx, VoxVAEGenerator(vae, patch), context_patches(vae, patch))


create_engine.args_type = CodecArgs
