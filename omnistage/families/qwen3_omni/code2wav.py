"""The code2wav stage: `Qwen3OmniMoeCode2Wav` behind the generation engine.

Codes in are the talker's [T, 16] frames (EOS frames dropped by the input processor); audio out is 1920
samples a frame at 24 kHz. The decoder is causal, but a decode of T frames gives T × 1920 − `tail` samples:
the last `tail` (555) samples of a window wait for the next frame. So a chunk's audio runs from `tail`
samples before its first frame to `tail` before its end (the first chunk from 0), and chunks decoded with
the decoder's whole receptive field as left context (`context_frames`) join into the one-pass waveform.

Async chunk, by default, decodes each request as one stream (code2wav_stream.py): each chunk once, its
layers continuing the state the request's earlier chunks left, joining into the one-pass waveform.
`left_context_frames` instead decodes each chunk again behind that many earlier frames ("exact": the whole
receptive field, `context_frames`). Full handoff (one window holding the whole request) decodes exactly as
the reference: `chunked_decode` (300-frame chunks, 25 frames of left context; past 300 frames that differs
from one pass, see tiny-qwen3-omni.md).
"""

from __future__ import annotations

from collections.abc import Generator as Steps
from typing import Any

import torch

from omnistage.families.qwen3_omni.code2wav_stream import decode_stream
from omnistage.families.qwen3_omni.loaders import load_code2wav
from omnistage.families.shared.codec_stage import CodecArgs, codec_engine
from omnistage.families.shared.codec_stream import CodecStream
from omnistage.stages.base import EngineContext
from omnistage.stages.generation.engine import GenerationBatch, GenerationEngine, WindowDone, window_by_window

SAMPLE_RATE = 24000


class Code2WavGenerator:
    """`run(batch)`: each window's audio for its emitted frames; with stream ids, each window continues its
    stream (the engine's `streams`)."""

    sample_rate = SAMPLE_RATE
    emits_spans = True

    def __init__(self, code2wav: Any, one_pass: bool):
        self.code2wav = code2wav
        self.outputs_per_frame = int(code2wav.total_upsample)
        self.one_pass = one_pass  # full handoff: the whole request in one window, decoded as the reference
        self.streams: dict[str, CodecStream] = {}
        with torch.inference_mode():
            probe = torch.zeros(1, code2wav.config.num_quantizers, 1, dtype=torch.long)
            self.tail = self.outputs_per_frame - code2wav(probe).shape[-1]

    def run(self, batch: GenerationBatch) -> Steps[WindowDone, None, list[torch.Tensor]]:
        """One window a unit, each sent as soon as it is decoded: the engine may run a new request's first
        chunk between two windows of a pass, and of a pass of first chunks each is heard after its own."""
        ids = batch.stream_ids

        def decode(i: int) -> torch.Tensor:
            stream = None if ids is None else ids[i]
            return self._decode(batch.windows[i], batch.starts[i], batch.spans[i], stream)

        return window_by_window(decode, len(batch.windows))

    def _decode(
        self, window: torch.Tensor, start: int, span: tuple[int, int], stream: str | None
    ) -> torch.Tensor:
        skip, count = span
        if count == 0:
            return torch.empty(0)
        device = next(self.code2wav.parameters()).device
        codes = window.to(device, torch.long).clamp(min=0).T[None]  # [1, 16, T]
        if stream is not None:
            if stream not in self.streams:
                self.streams[stream] = CodecStream(self.code2wav.config)
            wave = decode_stream(self.code2wav, codes, self.streams[stream])
            return wave[0, 0].float().cpu()
        if self.one_pass:
            return self.code2wav.chunked_decode(codes)[0, 0].float().cpu()
        wav = self.code2wav(codes)[0, 0].float().cpu()
        per = self.outputs_per_frame
        first = 0 if start + skip == 0 else skip * per - self.tail
        return wav[first : (skip + count) * per - self.tail]

    def end_stream(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)


def context_frames(code2wav: Any) -> int:
    """Left context that makes a chunk's samples equal the one-pass decode's: the transformer's sliding
    windows (one per layer) plus a few frames for the convolutions' reach."""
    config = code2wav.config
    return int(config.sliding_window) * int(config.num_hidden_layers) + 4


def create_engine(ctx: EngineContext) -> GenerationEngine:
    """engine_args as the Qwen3-TTS codec stage's (`chunk_frames`, `first_chunk_frames`,
    `left_context_frames` ("stream", the default; "exact": `context_frames`), `max_chunk_frames`);
    `async_chunk: false` decodes each request in one pass, exactly as the reference."""
    code2wav = load_code2wav(ctx.model_dir, ctx.device)
    generator = Code2WavGenerator(code2wav, one_pass=ctx.deploy.async_chunk is False)
    return codec_engine(ctx, generator, context_frames(code2wav))


create_engine.args_type = CodecArgs
