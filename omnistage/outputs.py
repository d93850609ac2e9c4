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


class StageOutput(msgspec.Struct):
    """One step's delta for one request, produced by a `StageEngine`.

    `tensors` hold rows to append along dim 0 (hidden states, audio samples) or whole artifacts sent
    once (images, a video); `data` holds small facts (progress, logprobs, prompt token ids, metrics).
    """

    request_id: str
    token_ids: list[int] = msgspec.field(default_factory=list)
    text: str = ""
    tensors: dict[str, Any] = msgspec.field(default_factory=dict)
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    finished: bool = False
    finish_reason: str | None = None  # stop | length | abort | error
    error: str | None = None
    error_type: str | None = None


class StageResult(msgspec.Struct):
    """Everything one stage produced for one request so far: what downstream input processors read."""

    stage_id: int
    token_ids: list[int] = msgspec.field(default_factory=list)
    text: str = ""
    chunks: dict[str, list[Any]] = msgspec.field(default_factory=dict)
    data: dict[str, Any] = msgspec.field(default_factory=dict)
    finished: bool = False
    finish_reason: str | None = None

    def add(self, out: StageOutput) -> None:
        self.token_ids.extend(out.token_ids)
        self.text += out.text
        for key, value in out.tensors.items():
            self.chunks.setdefault(key, []).append(value)
        self.data.update(out.data)
        if out.finished:
            self.finished = True
            self.finish_reason = out.finish_reason

    def tensor(self, key: str) -> Any:
        """The whole payload under `key`: its chunks joined along dim 0 (None if the stage sent none)."""
        parts = self.chunks.get(key)
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    def tail(self, key: str, rows: int) -> Any:
        """The last `rows` rows of the payload under `key`, joining only the chunks they lie in (a consumer
        of a stream reads what is new without copying the whole payload on every chunk)."""
        picked, taken = [], 0
        for part in reversed(self.chunks.get(key) or []):
            if taken >= rows and picked:
                break
            picked.append(part)
            taken += part.shape[0]
        if taken < rows or not picked:
            raise ValueError(f"{key!r} has {taken} rows, {rows} requested")
        joined = picked[0] if len(picked) == 1 else torch.cat(picked[::-1], dim=0)
        return joined[joined.shape[0] - rows :]


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
    audio: torch.Tensor | None = None
    delta_audio: torch.Tensor | None = None
    sample_rate: int | None = None
    images: list[Any] = dataclasses.field(default_factory=list)
    video: torch.Tensor | None = None
    fps: int | None = None
    outputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    finish_reason: str | None = None
    error: OmniError | None = None
    progress: dict[str, Any] | None = None
    prompt_token_ids: list[int] = dataclasses.field(default_factory=list)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def usage(self) -> dict[str, int]:
        prompt = len(self.prompt_token_ids)
        completion = len(self.token_ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
