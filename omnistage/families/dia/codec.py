"""The codec stage: DAC's decoder behind the generation engine.

Frames in are undelayed DAC codes [T, C] (`undelay`: the decoder's delayed frames realigned, BOS and the
tail from channel 0's EOS cut, as the reference's `DiaProcessor.batch_decode` does); audio out is `hop`
samples a frame (512 at 44.1 kHz for the released DAC). Full handoff decodes each request in one pass, as
the reference (`DacModel.decode`). Async chunk decodes each chunk behind its exact context: DAC's convs
are not causal (symmetric "same" padding, transposed convs of kernel 2 x stride), so a frame's samples
depend on frames on both sides; `context_frames` is how many, each side, and a window that covers them
reproduces the one-pass samples of its chunk. A stream (carried state) would need causal convs, so chunks
pay their context again (10 frames each side for the released DAC, 18 for the tiny one whose hop is
32 samples).

Only the DAC is loaded (`<dir>/dac`, else where the processor's config names it), not the Dia model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator as Steps
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnistage.families.shared.codec_stage import CodecArgs, codec_engine
from omnistage.stages.ar.loader import resolve_dtype
from omnistage.stages.base import EngineContext
from omnistage.stages.generation.engine import (
    GenerationBatch,
    GenerationEngine,
    WindowDone,
    generate_by_window,
)


def codec_dir(model_dir: str | Path) -> str:
    """The DAC checkpoint a Dia directory decodes with: its `dac/`, else the processor config's path."""
    local = Path(model_dir) / "dac"
    if (local / "config.json").exists():
        return str(local)
    config = json.loads((Path(model_dir) / "processor_config.json").read_text())
    return str(config["audio_tokenizer"]["audio_tokenizer_name_or_path"])


def load_dac(model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    from transformers import DacModel

    return DacModel.from_pretrained(codec_dir(model_dir), dtype=dtype).to(device).eval()


def undelay(frames: torch.Tensor, delay: list[int], eos: int) -> torch.Tensor:
    """The decoder's delayed frames [K, C] (its generated ones, the prefix excluded) → the audio frames
    whose every channel has arrived [T, C]: frame j's channel c is delayed frame j + delay[c]; they end at
    channel 0's EOS (the reference's `batch_decode` cut)."""
    ended = (frames[:, 0] == eos).nonzero()
    ready = frames.shape[0] - max(delay)
    count = max(min(int(ended[0]), ready) if len(ended) else ready, 0)
    index = torch.arange(count)[:, None] + torch.tensor(delay)[None]
    return frames.gather(0, index) if count else frames.new_zeros((0, frames.shape[1]))


def context_frames(codec: Any) -> tuple[int, int]:
    """(left, right): the frames before and after a chunk that its samples depend on (DAC's decoder's
    receptive field, in frames), so a window with that context decodes the chunk's samples exactly as one
    pass. Found by carrying one frame's output samples back through each layer (convs: `dilation x (kernel
    - 1) - padding` ahead, `padding` behind; a transposed conv's output n reads inputs t with 0 <= n +
    padding - t x stride < kernel)."""
    from transformers.models.dac.modeling_dac import DacDecoderBlock, DacResidualUnit

    decoder = codec.decoder
    hop = math.prod(codec.config.upsampling_ratios)
    layers: list[nn.Module] = [decoder.conv1]
    for block in decoder.block:
        if not isinstance(block, DacDecoderBlock):
            raise TypeError(f"an unknown DAC decoder block: {type(block).__name__}")
        layers.append(block.conv_t1)
        for unit in (block.res_unit1, block.res_unit2, block.res_unit3):
            if not isinstance(unit, DacResidualUnit):
                raise TypeError(f"an unknown DAC residual unit: {type(unit).__name__}")
            layers += [unit.conv1, unit.conv2]
    layers.append(decoder.conv2)
    frame = 10**6  # far from both ends
    lo, hi = frame * hop, (frame + 1) * hop - 1  # the frame's output samples
    for layer in reversed(layers):
        (k,), (d,), (p,), (s,) = layer.kernel_size, layer.dilation, layer.padding, layer.stride
        if isinstance(layer, nn.ConvTranspose1d):
            lo, hi = -((k - 1 - lo - p) // s), (hi + p) // s
        else:
            lo, hi = lo * s - p, hi * s - p + d * (k - 1)
    return frame - lo, hi - frame


class DiaCodecGenerator:
    """`generate(windows, params)`: one waveform [T * hop] per [T, C] window of undelayed codes."""

    def __init__(self, codec: Any, delay_pattern: list[int], special: dict[str, int]):
        self.codec = codec
        self.sample_rate = int(codec.config.sampling_rate)
        self.outputs_per_frame = int(math.prod(codec.config.upsampling_ratios))
        self.delay_pattern, self.special = delay_pattern, special

    def run(self, batch: GenerationBatch) -> Steps[WindowDone, None, list[torch.Tensor]]:
        """A window a unit, each sent as soon as it is decoded."""
        return generate_by_window(self.generate, batch)

    def generate(self, windows: list[torch.Tensor], params: list[Any]) -> list[torch.Tensor]:
        device = next(self.codec.parameters()).device
        out = []
        with torch.inference_mode():
            for window in windows:
                if window.shape[0] == 0:
                    out.append(torch.empty(0))
                    continue
                codes = window.to(device, torch.long).T[None]  # [1, C, T]
                out.append(self.codec.decode(audio_codes=codes).audio_values[0].float().cpu())
        return out


def create_engine(ctx: EngineContext) -> GenerationEngine:
    """DAC's decoder on the generation engine, sized by `CodecArgs` (shared/codec_stage.py): DAC is not
    causal, so every chunk is decoded behind and ahead of its exact context (`context_frames`), and
    `async_chunk: false` decodes each request in one pass, exactly as the reference. The deployment's
    `dtype` ("auto": the checkpoint's) is the codec's."""
    from transformers import DiaConfig

    dtype = resolve_dtype(ctx.deploy.dtype, ctx.model_dir, ctx.device)
    codec = load_dac(ctx.model_dir, dtype, ctx.device)
    config = DiaConfig.from_pretrained(ctx.model_dir)
    dec = config.decoder_config
    special = {"bos": dec.bos_token_id, "eos": dec.eos_token_id, "pad": dec.pad_token_id}
    generator = DiaCodecGenerator(codec, list(config.delay_pattern), special)
    left, right = context_frames(codec)
    return codec_engine(ctx, generator, left, look_ahead=right)


create_engine.args_type = CodecArgs
