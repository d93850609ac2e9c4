"""A codec decoder behind the generation engine, as every codec-language-model family deploys it: the
engine_args that size its chunks (`CodecArgs`) and the engine built from them (`codec_engine`). A family's
generator decodes code windows into waveforms; one that also keeps per-stream state (`end_stream`) decodes a
request's async chunks as one stream."""

from __future__ import annotations

from typing import Any, Literal

from omnistage.errors import ConfigError
from omnistage.stages.base import EngineContext
from omnistage.stages.engine_args import EngineArgs
from omnistage.stages.generation.engine import GenerationEngine


class CodecArgs(EngineArgs):
    """A codec stage's `engine_args` (codec_engine says what each does)."""

    chunk_frames: int = 25
    first_chunk_frames: int | list[int] | None = None  # None: chunk_frames
    left_context_frames: int | Literal["stream", "exact"] | None = None  # None: "stream" where it can
    max_chunk_frames: int = 300


def codec_engine(
    ctx: EngineContext, generator: Any, exact_context: int, look_ahead: int = 0
) -> GenerationEngine:
    """The generation engine over a codec generator, sized by the stage's engine_args (CodecArgs):
    `chunk_frames` (25), `first_chunk_frames` (the first chunk: its audio waits for fewer frames; a list
    such as [2, 4, 8, 16] picks one by the stage's load as each request arrives, as vLLM-Omni does; a
    request's own first chunk overrides it), `left_context_frames` ("stream", the default where the
    generator keeps streams: each request's chunks continue its stream; a number: each chunk decoded again
    behind that many earlier frames; "exact": `exact_context`, the frames of left context that make chunks
    join into the one-pass waveform), `max_chunk_frames` (300). A stage deployed with `async_chunk: false`
    decodes each request in one pass. `look_ahead`: the frames after a chunk a codec whose layers are not
    causal reads (its right receptive field): every chunk waits for them, no stream can carry it, and its
    left context defaults to "exact"."""
    args = CodecArgs.of(ctx.engine_args)
    if ctx.deploy.async_chunk is False:
        return GenerationEngine(generator, max_num_seqs=ctx.deploy.max_num_seqs)
    chunk = args.chunk_frames
    streamable = callable(getattr(generator, "end_stream", None)) and look_ahead == 0
    left = args.left_context_frames
    if left == "stream" and not streamable:
        why = f"reads {look_ahead} frames ahead (not causal)" if look_ahead else "keeps no streams"
        raise ConfigError(
            f"left_context_frames: 'stream' needs a causal codec that keeps streams; this one {why}"
        )
    left = ("stream" if streamable else "exact" if look_ahead else 25) if left is None else left
    streams = left == "stream"
    left = 0 if streams else exact_context if left == "exact" else int(left)
    first = chunk if args.first_chunk_frames is None else args.first_chunk_frames
    sizes = sorted(int(n) for n in first) if isinstance(first, list | tuple) else None  # chosen by load
    return GenerationEngine(
        generator,
        max_num_seqs=ctx.deploy.max_num_seqs,
        chunk_size=chunk,
        max_chunk_size=args.max_chunk_frames,
        first_chunk_size=sizes[0] if sizes else int(first),
        first_chunk_sizes=sizes,
        left_context=left,
        right_context=look_ahead,
        streams=streams,
    )
