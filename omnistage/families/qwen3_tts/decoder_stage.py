"""The codec-decoder stage: the 12 Hz codec decoder (codec.py) behind the generation engine.

Frames in are the talker's [T, 16] codes (EOS frames dropped by the input processor); audio out is 1920
samples a frame at 24 kHz. Full handoff decodes as the reference does (`chunked_decode`: 300-frame chunks,
25 frames of left context). Async chunk, by default, decodes each request as a stream: each chunk once,
continuing the layer states the request's earlier chunks left (`StreamState`), so the chunks cost only
their own frames and join into the one-pass waveform. `left_context_frames` instead decodes each chunk
again with that many earlier frames as context (the reference's own chunking), and no look-ahead (every
layer is causal, so later frames never change earlier samples).
"""

from __future__ import annotations

from collections.abc import Generator as Steps
from pathlib import Path

import torch

from omnistage.families.qwen3_tts.codec import SUBFOLDER, CodecDecoder, StreamState, load_codec
from omnistage.families.shared.codec_stage import CodecArgs, codec_engine
from omnistage.stages.ar.loader import resolve_dtype
from omnistage.stages.base import EngineContext
from omnistage.stages.generation.engine import GenerationBatch, GenerationEngine, WindowDone, window_by_window

SAMPLE_RATE = 24000


class CodecGenerator:
    """`run(batch)`: one waveform [T * 1920] per [T, 16] code window; with stream ids, each window continues
    its stream (the engine's `streams`)."""

    sample_rate = SAMPLE_RATE

    def __init__(self, codec: CodecDecoder):
        self.codec = codec
        self.outputs_per_frame = codec.total_upsample
        self.streams: dict[str, StreamState] = {}

    def run(self, batch: GenerationBatch) -> Steps[WindowDone, None, list[torch.Tensor]]:
        """One window a unit, each sent as soon as it is decoded: the engine may run a new request's first
        chunk between two windows of a pass (a pass holds up to max_num_seqs windows of 25 frames, seconds of
        work on one core), and of a pass of first chunks each is heard after its own decode."""
        ids = batch.stream_ids
        return window_by_window(
            lambda i: self._decode(batch.windows[i], None if ids is None else ids[i]), len(batch.windows)
        )

    def _decode(self, window: torch.Tensor, stream_id: str | None) -> torch.Tensor:
        if window.shape[0] == 0:
            return torch.empty(0)
        codes = window.to(next(self.codec.parameters()).device, torch.long).clamp(min=0).T[None]  # [1, 16, T]
        if stream_id is None:
            wave = self.codec.chunked_decode(codes)
        else:
            wave = self.codec(codes, self.streams.setdefault(stream_id, StreamState()))
        return wave[0, 0].float().cpu()

    def end_stream(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)


def create_engine(ctx: EngineContext) -> GenerationEngine:
    """engine_args: `chunk_frames` (25), `first_chunk_frames` (the first chunk: its audio waits for fewer
    frames; a list such as [2, 4, 8, 16] picks one by the stage's load as each request arrives, as vLLM-Omni
    does; a request's `initial_codec_chunk_frames` overrides it), `left_context_frames` ("stream", the
    default: no context, each request's chunks continue its stream, joining into the one-pass waveform; a
    number: each chunk decoded again with that many earlier frames, 25 being the reference's own chunked
    decode; "exact": the decoder's receptive field, `CodecDecoder.context_frames`, which also joins into
    the one-pass waveform, at the cost of decoding it again for every chunk), `max_chunk_frames` (300).
    A stage deployed with `async_chunk: false` decodes each request in one pass, as the reference. The
    deployment's `dtype` ("auto": the codec config's, float32 if it names none) is the codec's."""
    codec_dir = Path(ctx.model_dir) / SUBFOLDER
    codec_dir = codec_dir if codec_dir.exists() else Path(ctx.model_dir)
    dtype = resolve_dtype(ctx.deploy.dtype, str(codec_dir), ctx.device)
    codec = load_codec(ctx.model_dir, dtype, ctx.device)
    generator = CodecGenerator(codec)
    generator.model_dir = ctx.model_dir  # a Base clone's clip codes: its encoder, loaded on demand
    return codec_engine(ctx, generator, codec.context_frames())


create_engine.args_type = CodecArgs
