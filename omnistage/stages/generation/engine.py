"""Generation engine: batches single-pass generators (vocoders, codec decoders).

A request's input (codes) may arrive whole (full handoff: one pass at the end) or in chunks (async chunk:
a pass per `chunk_size` new frames). A chunk is decoded with `left_context` earlier frames and
`right_context` later ones as context, and only its own span of the output is emitted, so the joined
output stays close to a one-pass decode while audio starts long before the input is complete. A stage
that fell behind decodes several whole chunks in one span (up to `max_chunk_size`), but the spans end where
they would have had it kept up (the first chunk, whole chunks, the tail alone): where whole chunks decode
the same together as apart (VoxCPM2's streaming VAE, tests/voxcpm2), a request's audio does not depend on the
stage's timing.

A request's inputs are a `GenerationInputs` (generation_inputs.py).

A request may start with context-only frames (`context_frames`: the first N input frames, e.g. a
cloned voice's reference clip codes that the model continues): they are decoded as left context (all of
them in a one-pass decode) and never emitted.

The first chunk's size may follow the load (`first_chunk_sizes`, e.g. [2, 4, 8, 16]: the smallest when the
stage is nearly idle, the largest when it is full, chosen as a request arrives from active requests /
`max_num_seqs`), and a request may ask its own (`first_chunk_frames`; 0: the regular chunk).

A causal generator that can carry a stream's state from one call to the next (`end_stream`, see
`Generator`) can decode chunks with no context at all (`streams=True`): each request's frames are fed to it
once, in order, under the request's id, and it is told when the request ends. Its chunks then cost only
their own frames, and join into the one-pass output (up to float rounding) instead of approximating it.

A generator that can pause (its `run` yields between units of work such as ODE steps) lets a request's
first chunk overtake a long pass already running: the engine advances one unit per `step()`, and
a first-chunk pass, when there is one, goes before the pass it interrupted (time to first audio waits for
one unit of the longer pass, not all of it). A generator that decodes its windows one after the other
(`window_by_window`) yields each window's output as it is done, and the engine sends it at once: of eight
first chunks in one pass, the first is heard after one window's decode, not eight.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from collections.abc import Generator as Steps
from typing import Any, ClassVar, Protocol

import torch

from omnistage.config.pipeline import load_ref
from omnistage.outputs import StageOutput
from omnistage.prompts import TextPrompt
from omnistage.stages.base import EngineContext, StageInputContext, StageRequest
from omnistage.stages.engine_args import EngineArgs
from omnistage.stages.generation.generation_inputs import GenerationInputs
from omnistage.stages.typed_inputs import inputs_of

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class GenerationBatch:
    """One batched call of a generator: everything the engine knows of each window, whatever the generator
    uses of it."""

    windows: list[torch.Tensor]  # each request's input frames for this call (context included)
    params: list[Any]  # each request's params
    starts: list[int]  # each window's first frame index in its request's whole input
    spans: list[tuple[int, int]]  # each window's (frames of context, frames to emit)
    stream_ids: list[str] | None = None  # with streams: the request each window continues


class Generator(Protocol):
    """A single-pass model. `outputs_per_frame` output rows correspond to one input frame.

    The engine calls it one way: `run(batch)`, a Python generator that yields between units of work (ODE
    steps, sentences; a model without such units yields none: `one_unit`) and returns one output per
    window. The engine advances one unit per step, so a more urgent pass can run in between. A unit may
    finish a window: it then yields `WindowDone` (`window_by_window`), whose output is sent right away.

    `emits_spans = True`: the outputs hold only each window's emitted frames (`batch.spans`), the context
    skipped; otherwise the engine cuts them out. A causal generator may carry state between calls: with
    `streams=True` each window continues the stream of `batch.stream_ids[i]` (a new id: a new stream), and
    `end_stream(id)` drops a stream's state.
    """

    outputs_per_frame: int
    sample_rate: int | None

    def run(self, batch: GenerationBatch) -> Steps[WindowDone | None, None, list[torch.Tensor]]: ...


@dataclasses.dataclass
class WindowDone:
    """Yielded by a generator's `run` when one window's output is final: sent before the pass ends."""

    index: int
    output: torch.Tensor


def window_by_window(
    decode: Callable[[int], torch.Tensor], count: int
) -> Steps[WindowDone, None, list[torch.Tensor]]:
    """`run` for a generator that decodes a batch's windows one after the other (`decode(i)`): a window a
    unit, each window's output yielded as soon as it exists (its request hears it without waiting for the
    pass's other windows), all of them returned at the end."""
    outputs = []
    for i in range(count):
        outputs.append(decode(i))
        if i + 1 < count:
            yield WindowDone(i, outputs[i])
    return outputs


def generate_by_window(
    generate: Callable[..., list[torch.Tensor]], batch: GenerationBatch
) -> Steps[WindowDone, None, list[torch.Tensor]]:
    """`window_by_window` over a `generate(windows, params[, stream_ids])` that decodes each window on its
    own: called with one window at a time (and its stream id, where the batch continues streams)."""
    ids = batch.stream_ids

    def decode(i: int) -> torch.Tensor:
        streams = () if ids is None else ([ids[i]],)
        return generate([batch.windows[i]], [batch.params[i]], *streams)[0]

    return window_by_window(decode, len(batch.windows))


def one_unit(call: Any) -> Steps[None, None, list[torch.Tensor]]:
    """`run` for a generator whose whole call is one unit of work: `call()`'s outputs, yielding nothing."""
    return call()
    yield  # a generator function


def run_to_end(steps: Steps[None, None, Any]) -> Any:
    """Run a generator's `run` (or any such Python generator) without pausing; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


@dataclasses.dataclass
class _Pass:
    """One batched generator call in progress: its requests, what each will emit, and its unit steps."""

    batch: list[tuple[str, _Request, int, int]]  # (request id, state, first frame, end frame)
    spans: list[tuple[int, int]]  # per window: (frames of left context, frames emitted)
    steps: Steps[WindowDone | None, None, list[torch.Tensor]]
    streaming: bool = False  # it holds a request whose input is still arriving
    sent: set[int] = dataclasses.field(default_factory=set)  # windows whose output went out already


@dataclasses.dataclass
class _Request:
    request: StageRequest
    frames: list[torch.Tensor]
    available: int
    emitted: int = 0  # frames whose output has been sent (or that are context only)
    context: int = 0  # leading frames that are context only, never emitted
    complete: bool = False
    in_flight: bool = False  # inside a pass that has not finished
    reported: bool = False  # an output has been sent
    first_chunk: int | None = None  # this request's first chunk size (None: the engine's)
    fed: int = 0  # frames already fed to a streaming generator (it carries their state)

    @property
    def fresh(self) -> bool:
        """Nothing of its own output has been emitted yet."""
        return self.emitted == self.context

    def inputs(self) -> torch.Tensor:
        if len(self.frames) > 1:
            self.frames = [torch.cat(self.frames, dim=0)]
        return self.frames[0]


class GenerationEngine:
    def __init__(
        self,
        generator: Generator,
        max_num_seqs: int = 16,
        chunk_size: int | None = None,
        left_context: int = 0,
        right_context: int = 0,
        output_key: str = "audio",
        max_chunk_size: int | None = None,
        first_chunk_size: int | None = None,
        first_right_context: int | None = None,
        first_chunk_sizes: list[int] | None = None,
        streams: bool = False,
    ):
        if chunk_size is not None and chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.generator = generator
        self.max_num_seqs = max_num_seqs
        self.chunk_size = chunk_size
        # A request whose input got ahead of decoding catches up in one longer span (whole chunks, at most
        # this many frames): its context is paid once instead of once per chunk.
        self.max_chunk_size = chunk_size
        if chunk_size and max_chunk_size:
            self.max_chunk_size = max(chunk_size, max_chunk_size // chunk_size * chunk_size)
        # A request's first output may be smaller than the rest: its first audio waits for fewer input
        # frames and costs a smaller decode (time to first audio); the later chunks keep the larger size.
        self.first_chunk_size = first_chunk_size or chunk_size
        self.first_chunk_sizes = sorted(int(n) for n in first_chunk_sizes or [])
        if any(n < 1 for n in self.first_chunk_sizes):
            raise ValueError("first_chunk_sizes must be >= 1")
        self.left_context = left_context
        self.right_context = right_context
        # The first chunk may also look less far ahead: its audio waits for fewer input frames.
        self.first_right_context = right_context if first_right_context is None else first_right_context
        # Chunks continue each request's stream in the generator (no context recomputed); async chunk only.
        self.streams = streams and chunk_size is not None
        if not callable(getattr(generator, "run", None)):
            raise ValueError(f"{type(generator).__name__} is no generator: it has no run(batch)")
        if self.streams and not callable(getattr(generator, "end_stream", None)):
            raise ValueError(f"{type(generator).__name__} cannot carry streams (no end_stream)")
        if self.streams and (left_context or right_context):
            raise ValueError("a streaming generator takes no left or right context")
        self.output_key = output_key
        self.requests: dict[str, _Request] = {}
        self.paused = False
        self.passes = 0
        self.first_pass: _Pass | None = None  # requests' first chunks: runs before `pass_`
        self.pass_: _Pass | None = None

    # ---- StageEngine ---------------------------------------------------------------------------------
    def add_request(self, request: StageRequest) -> None:
        inputs = inputs_of(GenerationInputs, request.inputs)
        frames = self._frames(request.prompt if inputs.frames is None else inputs.frames)
        context = min(int(inputs.context_frames), len(frames))
        complete = not request.streaming_input
        state = _Request(request, [frames], len(frames), emitted=context, context=context, complete=complete)
        state.first_chunk = self._first_chunk(inputs.first_chunk_frames)
        self.requests[request.request_id] = state

    def _first_chunk(self, asked: Any) -> int | None:
        """A new request's first chunk: its own ask, else by load among `first_chunk_sizes`."""
        if asked is not None:
            return int(asked) or self.chunk_size
        if not self.first_chunk_sizes:
            return None
        load = (len(self.requests) + 1) / max(self.max_num_seqs, 1)
        sizes = self.first_chunk_sizes
        return sizes[min(len(sizes) - 1, int(load * len(sizes)))]

    def add_chunk(self, request_id: str, inputs: GenerationInputs | None, last: bool) -> None:
        """More frames for a streaming request (`inputs.frames`; None: none this time)."""
        state = self.requests.get(request_id)
        if state is None:
            return
        frames = inputs_of(GenerationInputs, inputs).frames
        if frames is not None:
            frames = self._frames(frames)
            state.frames.append(frames)
            state.available += len(frames)
        state.complete = state.complete or last

    def abort(self, request_id: str) -> None:
        if self.requests.pop(request_id, None) is not None:
            self._end_stream(request_id)

    def _end_stream(self, request_id: str) -> None:
        if self.streams:
            self.generator.end_stream(request_id)

    def has_work(self) -> bool:
        if self.paused:
            return False
        return bool(self.first_pass or self.pass_) or any(
            self._ready_span(s) is not None for s in self.requests.values() if not s.in_flight
        )

    def first_output_pending(self) -> bool:
        """Whether a streaming request's first chunk is being decoded or is ready to be: the work a user
        waits on for first audio (stages deployed with `yield_to_first_outputs` give way to it)."""
        if self.first_pass is not None and self.first_pass.streaming:
            return True
        return any(
            s.fresh and not s.complete and not s.in_flight and self._ready_span(s) is not None
            for s in self.requests.values()
        )

    def step(self) -> list[StageOutput]:
        """Start what is due, then advance the most urgent pass by one unit."""
        ready, outputs = [], []
        for rid, state in list(self.requests.items()):
            span = None if state.in_flight else self._ready_span(state)
            if span is None:
                continue
            if span[0] == span[1]:  # input ended with nothing left to decode
                outputs.append(self._output(rid, state, span[1], torch.empty(0)))
            else:
                ready.append((rid, state, *span))
        # Requests that have output nothing yet go first, and alone: their first chunk (time to first audio)
        # waits neither behind nor inside the longer catch-up windows of requests already playing.
        fresh = [item for item in ready if item[1].fresh]
        if fresh and self.first_pass is None:
            self.first_pass = self._start(fresh[: self.max_num_seqs])
        elif ready and self.first_pass is None and self.pass_ is None:
            self.pass_ = self._start(ready[: self.max_num_seqs])
        run = self.first_pass or self.pass_
        if run is not None:
            outputs.extend(self._advance(run))
        return outputs

    def _start(self, batch: list[tuple[str, _Request, int, int]]) -> _Pass:
        windows, params, starts, spans = [], [], [], []
        for _, state, start, end in batch:
            # A one-pass decode reads all of a request's context frames; a chunked one its left context; a
            # stream every frame it has not fed yet (its context frames, then each chunk once).
            back = max(self.left_context, state.context if self.chunk_size is None else 0)
            lo = state.fed if self.streams else max(0, start - back)
            state.fed = end
            right = self.first_right_context if state.fresh else self.right_context
            hi = min(state.available, end + right)
            windows.append(state.inputs()[lo:hi])
            params.append(state.request.params)
            starts.append(lo)
            spans.append((start - lo, end - start))
            state.in_flight = True
        ids = [rid for rid, _, _, _ in batch] if self.streams else None
        steps = self.generator.run(GenerationBatch(windows, params, starts, spans, ids))
        return _Pass(batch, spans, steps, streaming=any(not state.complete for _, state, _, _ in batch))

    def _advance(self, run: _Pass) -> list[StageOutput]:
        """One unit of `run`: the output of a window it finished, all the rest once the pass has ended."""
        try:
            with torch.inference_mode():
                unit = next(run.steps)
        except StopIteration as done:
            results = done.value
        except BaseException:  # the worker fails the pass's requests; the slot must not stay taken
            self._release(run)
            for rid, _, _, _ in run.batch:  # a stream cut mid-pass cannot go on
                self._end_stream(rid)
            raise
        else:
            if not isinstance(unit, WindowDone):
                return []
            run.sent.add(unit.index)
            out = self._window_output(run, unit.index, unit.output)
            return [out] if out is not None else []
        self._release(run)
        self.passes += 1
        if len(results) != len(run.batch):
            raise ValueError(f"the generator returned {len(results)} outputs for {len(run.batch)} windows")
        outputs = []
        for index, result in enumerate(results):
            if index not in run.sent and (out := self._window_output(run, index, result)) is not None:
                outputs.append(out)
        return outputs

    def _window_output(self, run: _Pass, index: int, result: torch.Tensor) -> StageOutput | None:
        """A pass's window's output for its request (None if the request was aborted while it ran)."""
        rid, state, _, end = run.batch[index]
        if self.requests.get(rid) is not state:  # aborted while its pass ran
            self._end_stream(rid)
            return None
        skip, count = run.spans[index]
        per = self.generator.outputs_per_frame
        piece = (
            result
            if getattr(self.generator, "emits_spans", False)
            else result[skip * per : (skip + count) * per]
        )
        return self._output(rid, state, end, piece)

    def _release(self, run: _Pass) -> None:
        if self.first_pass is run:
            self.first_pass = None
        else:
            self.pass_ = None
        for _, state, _, _ in run.batch:
            state.in_flight = False

    def _output(self, rid: str, state: _Request, end: int, piece: torch.Tensor) -> StageOutput:
        first = not state.reported
        state.emitted, state.reported = end, True
        done = state.complete and state.emitted >= state.available
        if done:
            del self.requests[rid]
            self._end_stream(rid)
        out = StageOutput(rid, finished=done, finish_reason="stop" if done else None)
        if first:
            out.token_counts = state.request.token_counts
        if self.output_key == "audio":
            out.audio, out.sample_rate = piece, self.generator.sample_rate
        elif self.output_key == "codes":
            out.codes = piece
        elif self.output_key == "images":
            out.images = piece
        else:
            out.tensors[self.output_key] = piece
        return out

    def _ready_span(self, state: _Request) -> tuple[int, int] | None:
        """The frames [start, end) this request can decode now (empty: finish it), or None."""
        start, pending = state.emitted, state.available - state.emitted
        if state.complete:
            if pending <= 0:
                return start, start
            if self.chunk_size is None:
                return start, start + pending
            cap = self._span_cap(state)
            # whole chunks before the tail, as if the stage had kept up: a pass's rounding depends on its
            # span, so a stage that lagged at the end must not join the tail to them (same audio)
            whole = pending // self.chunk_size * self.chunk_size
            return start, start + min(whole or pending, cap)
        if self.chunk_size is None:
            return None
        if state.fresh:
            ready = pending - self.first_right_context
            first = state.first_chunk or self.first_chunk_size
            return (start, start + first) if ready >= first else None
        ready = (pending - self.right_context) // self.chunk_size * self.chunk_size
        if ready < self.chunk_size:
            return None
        return start, start + min(ready, self._span_cap(state))

    def _span_cap(self, state: _Request) -> int:
        """A request's first output is one (first) chunk, however much input is ready: its first audio should
        cost one chunk's decode, not a catch-up span's (a request that waited for the stage, e.g. behind
        another pass, would otherwise decode up to `max_chunk_size` frames before playing anything)."""
        return (state.first_chunk or self.first_chunk_size) if state.fresh else self.max_chunk_size

    def _frames(self, value: Any) -> torch.Tensor:
        if isinstance(value, TextPrompt):  # a stage fed its user's token ids: they are the frames
            value = value.token_ids
        if value is None:
            return torch.empty(0, dtype=torch.long)
        return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)

    def sleep(self, level: int = 1) -> None:
        self.paused = True

    def wake_up(self) -> None:
        self.paused = False

    def input_resources(self) -> Generator:
        """The generator (its code tables, sample rate) for the stage's processors."""
        return self.generator

    def stats(self) -> dict[str, Any]:
        return {"num_requests": len(self.requests), "passes": self.passes}

    def shutdown(self) -> None:
        """The worker is leaving: drop every request and the passes in flight (a generator suspended
        between its units holds its windows and partial outputs)."""
        for pass_ in (self.first_pass, self.pass_):
            if pass_ is not None and hasattr(pass_.steps, "close"):
                pass_.steps.close()
        self.requests.clear()
        self.first_pass = self.pass_ = None


class GenerationArgs(EngineArgs):
    """The default generation engine's `engine_args`: the generator, and how its input is chunked."""

    generator: Any = None  # "module:function" (or the callable): (EngineContext) -> Generator
    chunk_size: int | None = None
    max_chunk_size: int | None = None
    first_chunk_size: int | None = None
    first_chunk_sizes: list[int] | None = None
    first_right_context: int | None = None
    left_context: int = 0
    right_context: int = 0
    output_key: str = "audio"

    refs: ClassVar[tuple[str, ...]] = ("generator",)


def create_engine(ctx: EngineContext) -> GenerationEngine:
    """The generator named by `engine_args` (GenerationArgs) on the generation engine."""
    args = GenerationArgs.of(ctx.engine_args)
    factory = load_ref(args.generator)
    if factory is None:
        raise ValueError(f"stage {ctx.stage.name}: generation stages need engine_args.generator")
    options = {f: getattr(args, f) for f in args.__struct_fields__ if f != "generator"}
    return GenerationEngine(factory(ctx), max_num_seqs=ctx.deploy.max_num_seqs, **options)


create_engine.args_type = GenerationArgs


# ---- processors for the common case: upstream token ids are the codes ----------------------------------
def tokens_input_processor(ctx: StageInputContext) -> StageRequest:
    """Full handoff: every upstream token becomes one input frame."""
    codes = [t for sid in ctx.stage.inputs for t in ctx.upstream[sid].token_ids]
    return StageRequest(ctx.request_id, params=ctx.params, inputs=GenerationInputs(torch.tensor(codes)))


def tokens_chunk_processor(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: the upstream's new tokens are the new frames."""
    return stream_frames(ctx, torch.tensor(chunk.token_ids, dtype=torch.long), last)


def stream_frames(
    ctx: StageInputContext,
    frames: torch.Tensor,
    last: bool,
    start: Callable[[torch.Tensor], StageRequest] | None = None,
) -> StageRequest | GenerationInputs | None:
    """A chunk processor's answer for a generation stage fed frames as they come: the first chunk starts
    the request (`start(frames)`, by default one with the stage's params), each later one adds its frames
    (None while a chunk brings none and more are coming)."""
    if not ctx.state.get("started"):
        ctx.state["started"] = True
        if start is not None:
            return start(frames)
        return StageRequest(
            ctx.request_id, params=ctx.params, inputs=GenerationInputs(frames), streaming_input=True
        )
    return GenerationInputs(frames) if len(frames) or last else None
