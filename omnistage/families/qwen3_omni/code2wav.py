"""The code2wav stage: `Qwen3OmniMoeCode2Wav` behind the generation engine.

Codes in are the talker's [T, 16] frames (EOS frames dropped by the input processor); audio out is 1920
samples a frame at 24 kHz. The decoder is causal, but a decode of T frames gives T × 1920 − `tail` samples:
the last `tail` (555) samples of a window wait for the next frame. So a chunk's audio runs from `tail`
samples before its first frame to `tail` before its end (the first chunk from 0), and chunks decoded with
the decoder's whole receptive field as left context (`context_frames`) join into the one-pass waveform.

Full handoff (one window holding the whole request) decodes exactly as the reference: `chunked_decode`
(300-frame chunks, 25 frames of left context; past 300 frames that differs from one pass, see
tiny-qwen3-omni.md).
"""

from __future__ import annotations

from collections.abc import Generator as Steps
from typing import Any

import torch

from omnistage.families.qwen3_omni.loaders import load_code2wav
from omnistage.families.shared.codec_stage import CodecArgs, codec_engine
from omnistage.stages.base import EngineContext
from omnistage.stages.generation.engine import GenerationBatch, GenerationEngine, one_unit

SAMPLE_RATE = 24000


class Code2WavGenerator:
    """`generate(windows, params, starts, spans)`: each window's audio for its emitted frames."""

    sample_rate = SAMPLE_RATE
    emits_spans = True

    def __init__(self, code2wav: Any, one_pass: bool):
        self.code2wav = code2wav
        self.outputs_per_frame = int(code2wav.total_upsample)
        self.one_pass = one_pass  # full handoff: the whole request in one window, decoded as the reference
        with torch.inference_mode():
            probe = torch.zeros(1, code2wav.config.num_quantizers, 1, dtype=torch.long)
            self.tail = self.outputs_per_frame - code2wav(probe).shape[-1]

    def run(self, batch: GenerationBatch) -> Steps[None, None, list[torch.Tensor]]:
        return one_unit(lambda: self.generate(batch.windows, batch.params, batch.starts, batch.spans))

    def generate(
        self, windows: list[torch.Tensor], params: list[Any], starts: list[int], spans: list[tuple[int, int]]
    ) -> list[torch.Tensor]:
        device = next(self.code2wav.parameters()).device
        out = []
        for window, start, (skip, count) in zip(windows, starts, spans, strict=True):
            if count == 0:
                out.append(torch.empty(0))
                continue
            codes = window.to(device, torch.long).clamp(min=0).T[None]  # [1, 16, T]
            if self.one_pass:
                out.append(self.code2wav.chunked_decode(codes)[0, 0].float().cpu())
                continue
            wav = self.code2wav(codes)[0, 0].float().cpu()
            per = self.outputs_per_frame
            first = 0 if start + skip == 0 else skip * per - self.tail
            out.append(wav[first : (skip + count) * per - self.tail])
        return out


def context_frames(code2wav: Any) -> int:
    """Left context that makes a chunk's samples equal the one-pass decode's: the transformer's sliding
    windows (one per layer) plus a few frames for the convolutions' reach."""
    config = code2wav.config
    return int(config.sliding_window) * int(config.num_hidden_layers) + 4


def create_engine(ctx: EngineContext) -> GenerationEngine:
    """engine_args as the Qwen3-TTS codec stage's (`chunk_frames`, `first_chunk_frames`,
    `left_context_frames` ("exact": `context_frames`), `max_chunk_frames`); `async_chunk: false` decodes
    each request in one pass, exactly as the reference."""
    code2wav = load_code2wav(ctx.model_dir, ctx.device)
    generator = Code2WavGenerator(code2wav, one_pass=ctx.deploy.async_chunk is False)
    return codec_engine(ctx, generator, context_frames(code2wav))


create_engine.args_type = CodecArgs
