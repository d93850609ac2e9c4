"""The codec stage: Higgs Audio v2's codec decoder (`HiggsAudioV2TokenizerModel.decode`) behind the generation
engine.

Frames in are codec frames [T, K] (the talker's frames with the delay pattern reverted, pipeline.py); audio
out is 960 samples a frame at 24 kHz (25 Hz). Full handoff decodes each request in one pass exactly as the
reference (`processor.decode` → `audio_tokenizer.decode`).

Async chunk cannot stream: the decoder (RVQ dequantizer, a projection, then DAC's decoder) is not causal: its
convs pad both sides (kernel 7, residual units dilated 1/3/9) and its transposed convs overlap on both sides.
So each chunk is decoded again behind `left` earlier frames and ahead of `right` later ones, the decoder's
receptive field in frames each way (`context_frames`), and only the chunk's own samples are kept: chunks then
join into the one-pass waveform (up to float rounding). The right context is a lookahead: a chunk's audio
waits for `right` more frames from the talker.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator as Steps
from pathlib import Path
from typing import Any

import torch

from omnistage.families.shared.codec_stage import CodecArgs, codec_engine
from omnistage.stages.ar.loader import resolve_dtype
from omnistage.stages.base import EngineContext
from omnistage.stages.generation.engine import (
    GenerationBatch,
    GenerationEngine,
    WindowDone,
    generate_by_window,
)

CODEC_DIR = "audio_tokenizer"


def codec_dir(model_dir: str | Path) -> str:
    """Where the checkpoint's codec lives: its `audio_tokenizer/`, else the path its processor names."""
    local = Path(model_dir) / CODEC_DIR
    if local.exists():
        return str(local)
    config = Path(model_dir) / "processor_config.json"
    if config.exists():
        named = json.loads(config.read_text()).get("audio_tokenizer", {}).get("audio_tokenizer_name_or_path")
        if named:
            return str(named)
    raise FileNotFoundError(f"{model_dir}: no codec (audio_tokenizer/ or processor_config.json's)")


def load_codec(model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    from transformers import HiggsAudioV2TokenizerModel

    codec = HiggsAudioV2TokenizerModel.from_pretrained(codec_dir(model_dir), dtype=dtype)
    return codec.to(device).eval()


def context_frames(codec: Any, probe: int = 64) -> tuple[int, int]:
    """(left, right): how many earlier and later frames a frame's samples depend on (the decoder's receptive
    field in frames), measured on the decoder itself: one frame of a random window changed, the samples
    that moved span the frames it reaches. A chunk decoded behind `left` and ahead of `right` frames equals
    the one-pass decode over its own frames."""
    per = int(codec.config.hop_length)
    k = int(codec.config.num_quantizers)
    gen = torch.Generator().manual_seed(0)
    device = next(codec.parameters()).device
    codes = torch.randint(0, int(codec.config.codebook_size), (1, k, 2 * probe + 1), generator=gen)
    moved = codes.clone()
    moved[:, :, probe] = (moved[:, :, probe] + 1) % int(codec.config.codebook_size)
    with torch.inference_mode():
        a = codec.decode(codes.to(device)).audio_values[0, 0].float()
        b = codec.decode(moved.to(device)).audio_values[0, 0].float()
    changed = (a != b).nonzero()[:, 0]
    first, last = int(changed.min()), int(changed.max())
    # samples before frame `probe` that moved belong to frames that look `right` frames ahead, and so on
    right = math.ceil((probe * per - first) / per)
    left = math.ceil((last + 1 - (probe + 1) * per) / per)
    if max(left, right) >= probe:
        raise ValueError(f"the codec decoder reaches {max(left, right)}+ frames: beyond the probe")
    return left, right


class HiggsCodecGenerator:
    """`generate(windows, params)`: one waveform [T * 960] per [T, K] codec-frame window."""

    def __init__(self, codec: Any):
        self.codec = codec
        self.sample_rate = int(codec.config.sample_rate)
        self.outputs_per_frame = int(codec.config.hop_length)
        self.stream_ids = (1024, 1025)  # the talker's stream BOS and EOS codes (create_engine sets them)

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
                codes = window.to(device, torch.long).T[None]  # [1, K, T]
                out.append(self.codec.decode(codes).audio_values[0, 0].float().cpu())
        return out


def create_engine(ctx: EngineContext) -> GenerationEngine:
    """engine_args: `CodecArgs` (`chunk_frames`, `first_chunk_frames`, `max_chunk_frames`;
    `left_context_frames`: "exact" (the default, the decoder's receptive field) or a number; "stream" is
    refused: the decoder is not causal). Every chunk looks the receptive field ahead (the right context).
    `async_chunk: false` decodes each request in one pass, exactly as the reference. The deployment's
    `dtype` ("auto": the checkpoint's) is the codec's."""
    from transformers import HiggsAudioV2Config

    dtype = resolve_dtype(ctx.deploy.dtype, ctx.model_dir, ctx.device)
    codec = load_codec(ctx.model_dir, dtype, ctx.device)
    generator = HiggsCodecGenerator(codec)
    # the processors cut the talker's frames at its stream BOS/EOS frames (pipeline.py)
    config = HiggsAudioV2Config.from_pretrained(ctx.model_dir)
    generator.stream_ids = (int(config.audio_stream_bos_id), int(config.audio_stream_eos_id))
    left, right = context_frames(codec)
    return codec_engine(ctx, generator, left, look_ahead=right)


create_engine.args_type = CodecArgs
