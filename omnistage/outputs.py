"""What stages emit and what callers receive.

A `StageOutput` is one engine step's worth of news about one request (a *delta*). The orchestrator
accumulates deltas per stage and hands callers `OmniRequestOutput`s: one per update while a request
streams, and exactly one with `finished=True` at the end (success, abort or error alike).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import torch

from omnistage.errors import OmniError


class Progress(msgspec.Struct):
    """How far a multi-step request (a diffusion run) has come."""

    step: int
    total: int


class Choice(msgspec.Struct):
    """Which of a request's `n` sequences a delta belongs to (sampling with n > 1)."""

    index: int
    finished: bool = False
    finish_reason: str | None = None


class TokenCounts(msgspec.Struct, omit_defaults=True):
    """What a stage counts toward its request's usage, where the prompt it runs is not the user's input
    (a TTS talker's prompt is placeholder rows; its input is the text and a reference clip)."""

    input_text_tokens: int | None = None
    input_audio_tokens: int | None = None
    output_tokens: int | None = None

    def merged(self, other: TokenCounts | None) -> TokenCounts:
        """These counts with `other`'s set fields on top."""
        if other is None:
            return self
        changes = {f: v for f in self.__struct_fields__ if (v := getattr(other, f)) is not None}
        return msgspec.structs.replace(self, **changes)


# Bulk fields: tensors that are appended along dim 0 as a request streams (or sent once, for media).
BULK_FIELDS = ("hidden_states", "codes", "audio", "images", "video", "tensors")


class StageOutput(msgspec.Struct):
    """One step's delta for one request, produced by a `StageEngine`.

    Everything generic code reads (the orchestrator, the worker, the server) is a typed field. `tensors`
    and `data` belong to the producing family: extra payloads that only its own input processors (and
    tests) read, e.g. multimodal positions a thinker computes for its talker.
    """

    request_id: str
    token_ids: list[int] = msgspec.field(default_factory=list)
    text: str = ""  # the new text (detokenized delta)
    logprobs: list[Any] | None = None  # one entry per new token (see stages/ar/sampler.py)
    # Hidden states by layer (transformers' `hidden_states` index; -1 the last), one row per new position.
    hidden_states: dict[int, Any] = msgspec.field(default_factory=dict)
    codes: Any = None  # codec codes, [frames] or [frames, codebooks]
    audio: Any = None  # mono float samples, appended
    sample_rate: int | None = None
    images: Any = None  # [N, H, W, C] uint8 (or float in [0, 1] for output_format=tensor), sent once
    video: Any = None  # [N, F, H, W, C], sent once
    fps: int | None = None
    progress: Progress | None = None
    prompt_token_ids: list[int] | None = None  # sent with a request's first output
    num_cached_tokens: int | None = None
    choice: Choice | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended the sequence
    token_counts: TokenCounts | None = None  # sent with a request's first output, when the stage counts
    metrics: dict[str, Any] = msgspec.field(default_factory=dict)
    tensors: dict[str, Any] = msgspec.field(default_factory=dict)
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    finished: bool = False
    finish_reason: str | None = None  # stop | length | abort | error
    error: str | None = None
    error_type: str | None = None
    error_param: str | None = None  # the request field an InvalidRequestError names

    def has_bulk(self) -> bool:
        return any(getattr(self, name) not in (None, {}) for name in BULK_FIELDS)

    def take_bulk(self) -> StageOutput:
        """Move the bulk fields into a new output (a worker holding tensors until a request ends)."""
        moved, empty = StageOutput(self.request_id), StageOutput(self.request_id)
        for name in BULK_FIELDS:
            setattr(moved, name, getattr(self, name))
            setattr(self, name, getattr(empty, name))
        return moved


def error_output(request_id: str, exc: BaseException) -> StageOutput:
    """The terminal output of a request an engine failed (or refused: an InvalidRequestError keeps its
    field, so the client hears a 400 naming it)."""
    message = exc.message if isinstance(exc, OmniError) else f"{type(exc).__name__}: {exc}"
    return StageOutput(
        request_id,
        finished=True,
        finish_reason="error",
        error=message,
        error_type=type(exc).__name__,
        error_param=getattr(exc, "param", None),
    )


def _join(parts: list[Any]) -> Any:
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


def _tail(parts: list[Any], rows: int, what: str) -> Any:
    """The last `rows` rows of chunked rows, joining only the chunks they lie in."""
    picked, taken = [], 0
    for part in reversed(parts):
        if taken >= rows and picked:
            break
        picked.append(part)
        taken += part.shape[0]
    if taken < rows or not picked:
        raise ValueError(f"{what} has {taken} rows, {rows} requested")
    joined = _join(picked[::-1])
    return joined[joined.shape[0] - rows :]


class StageResult(msgspec.Struct):
    """Everything one stage produced for one request so far: what downstream input processors read."""

    stage_id: int
    token_ids: list[int] = msgspec.field(default_factory=list)
    text: str = ""
    logprobs: list[Any] = msgspec.field(default_factory=list)
    hidden_chunks: dict[int, list[Any]] = msgspec.field(default_factory=dict)
    code_chunks: list[Any] = msgspec.field(default_factory=list)
    audio_chunks: list[Any] = msgspec.field(default_factory=list)
    image_chunks: list[Any] = msgspec.field(default_factory=list)
    video_chunks: list[Any] = msgspec.field(default_factory=list)
    sample_rate: int | None = None
    fps: int | None = None
    progress: Progress | None = None
    prompt_token_ids: list[int] | None = None
    num_cached_tokens: int | None = None
    choice: Choice | None = None
    stop_reason: str | int | None = None
    token_counts: TokenCounts | None = None
    metrics: dict[str, Any] = msgspec.field(default_factory=dict)
    chunks: dict[str, list[Any]] = msgspec.field(default_factory=dict)  # the family's `tensors`
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    finished: bool = False
    finish_reason: str | None = None

    def add(self, out: StageOutput) -> None:
        self.token_ids.extend(out.token_ids)
        self.text += out.text
        self.logprobs.extend(out.logprobs or [])
        for layer, rows in out.hidden_states.items():
            self.hidden_chunks.setdefault(layer, []).append(rows)
        for parts, value in (
            (self.code_chunks, out.codes),
            (self.audio_chunks, out.audio),
            (self.image_chunks, out.images),
            (self.video_chunks, out.video),
        ):
            if value is not None:
                parts.append(value)
        for key, value in out.tensors.items():
            self.chunks.setdefault(key, []).append(value)
        for name in (
            "sample_rate",
            "fps",
            "progress",
            "prompt_token_ids",
            "num_cached_tokens",
            "choice",
            "stop_reason",
        ):
            value = getattr(out, name)
            if value is not None:
                setattr(self, name, value)
        if out.token_counts is not None:
            self.token_counts = (self.token_counts or TokenCounts()).merged(out.token_counts)
        self.metrics.update(out.metrics)
        self.data.update(out.data)
        if out.finished:
            self.finished = True
            self.finish_reason = out.finish_reason

    def hidden(self, layer: int = -1) -> Any:
        """All hidden-state rows of `layer` so far (None if the stage sent none)."""
        return _join(self.hidden_chunks.get(layer, []))

    def hidden_tail(self, layer: int, rows: int) -> Any:
        """The last `rows` rows of `layer` (a consumer of a stream reads what is new without copying the
        whole payload on every chunk)."""
        return _tail(self.hidden_chunks.get(layer, []), rows, f"hidden layer {layer}")

    @property
    def codes(self) -> Any:
        return _join(self.code_chunks)

    @property
    def audio(self) -> Any:
        return _join(self.audio_chunks)

    def tensor(self, key: str) -> Any:
        """The whole family payload under `key`: its chunks joined along dim 0 (None if none was sent)."""
        return _join(self.chunks.get(key, []))

    def tail(self, key: str, rows: int) -> Any:
        return _tail(self.chunks.get(key) or [], rows, repr(key))

    def joined_bulk(self, out: StageOutput) -> None:
        """Put everything held so far into `out`, each payload joined once (the worker's held tensors)."""
        out.hidden_states = {layer: _join(parts) for layer, parts in self.hidden_chunks.items()}
        out.codes, out.audio = self.codes, self.audio
        out.images, out.video = _join(self.image_chunks), _join(self.video_chunks)
        out.tensors = {key: _join(parts) for key, parts in self.chunks.items()}


@dataclasses.dataclass
class OmniRequestOutput:
    """What `AsyncOmni.generate` yields.

    Cumulative fields (`text`, `token_ids`, `audio`, `images`, `video`) describe everything so far; the
    `delta_*` fields and `stage_id`/`modality` describe the update that produced this output.
    """

    request_id: str
    finished: bool = False
    stage_id: int | None = None
    modality: str | None = None
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    delta_text: str = ""
    delta_token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[Any] = dataclasses.field(default_factory=list)
    delta_logprobs: list[Any] = dataclasses.field(default_factory=list)
    audio: torch.Tensor | None = None
    delta_audio: torch.Tensor | None = None
    sample_rate: int | None = None
    images: list[Any] = dataclasses.field(default_factory=list)
    video: torch.Tensor | None = None
    fps: int | None = None
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    finish_reason: str | None = None
    error: OmniError | None = None
    progress: Progress | None = None
    prompt_token_ids: list[int] = dataclasses.field(default_factory=list)
    token_counts: TokenCounts | None = None  # what the stages counted toward usage (see TokenCounts)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def usage(self) -> dict[str, int]:
        prompt = len(self.prompt_token_ids)
        completion = len(self.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
