"""One request's journey through the stage graph, and the outputs callers see.

State machine: WAITING → RUNNING → FINISHED | ABORTED | FAILED. Terminal states never go back, and
`finish()` is the only way to reach one, so each request emits exactly one terminal output.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any

import torch

from omnistage.config.pipeline import PipelineSpec
from omnistage.connectors.base import Payload
from omnistage.errors import OmniError
from omnistage.outputs import OmniRequestOutput, StageOutput, StageResult


class RequestStatus(enum.StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"


TERMINAL = (RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.FAILED)
Sink = Callable[[OmniRequestOutput], None]


class RequestState:
    """What the orchestrator knows about one request: per-stage results, bindings and payloads."""

    def __init__(
        self,
        request_id: str,
        prompt: Any,
        params: dict[int, Any],
        needed: set[int],
        finals: set[int],
        pipeline: PipelineSpec,
        sink: Sink,
        materialize: Callable[[Any], Any],
    ):
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.needed = needed
        self.finals = finals
        self.pipeline = pipeline
        self.sink = sink
        self.materialize = materialize
        self.status = RequestStatus.WAITING
        self.results: dict[int, StageResult] = {sid: StageResult(stage_id=sid) for sid in needed}
        self.choices: dict[int, dict[int, StageResult]] = {}
        self.started: set[int] = set()  # stages the request was sent to
        self.bound: dict[int, int] = {}  # stage id → replica index
        self.payloads: list[Payload] = []
        self.audio: list[torch.Tensor] = []
        self.arrival = time.monotonic()
        self.marks: dict[str, float] = {}

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    def stage_finished(self, sid: int) -> bool:
        return self.results[sid].finished

    @property
    def all_finals_finished(self) -> bool:
        return all(self.results[sid].finished for sid in self.finals)

    def record(self, sid: int, out: StageOutput) -> None:
        """Fold a stage delta into the accumulated results."""
        self.status = RequestStatus.RUNNING
        index = out.choice.index if out.choice else 0
        if index:
            result = self.choices.setdefault(sid, {}).setdefault(index, StageResult(stage_id=sid))
            result.add(out)
            if out.finished:  # the request-level end arrives on whichever sequence ends last
                self.results[sid].finished = True
                self.results[sid].finish_reason = self.results[sid].finish_reason or out.finish_reason
            return
        self.results[sid].add(out)
        now = time.monotonic() - self.arrival
        self.marks.setdefault(f"stage{sid}_first_s", now)
        if out.finished:
            self.marks[f"stage{sid}_done_s"] = now

    # ---- outputs -------------------------------------------------------------------------------------
    def partial(self, sid: int, out: StageOutput) -> OmniRequestOutput | None:
        """The caller's view of one final-stage delta, or None if it carries nothing to show."""
        modality = self.pipeline.stage(sid).output_modality
        update = OmniRequestOutput(self.request_id, stage_id=sid, modality=modality)
        shown = False
        now = time.monotonic() - self.arrival
        if out.token_ids or out.text:
            result = self.results[sid]
            update.delta_token_ids, update.delta_text = list(out.token_ids), out.text
            update.token_ids, update.text = list(result.token_ids), result.text
            update.delta_logprobs = list(out.logprobs or [])
            self.marks.setdefault("ttft_s", now)
            shown = True
        if out.audio is not None:
            chunk = self.materialize(out.audio)
            self.audio.append(chunk)
            update.delta_audio = chunk
            update.sample_rate = self.results[sid].sample_rate
            self.marks.setdefault("first_audio_s", now)
            shown = True
        if out.progress is not None:
            update.progress = out.progress
            shown = True
        if out.choice is not None:
            update.data["index"] = out.choice.index
        update.prompt_token_ids = self.prompt_token_ids()
        return update if shown else None

    def prompt_token_ids(self) -> list[int]:
        for sid in sorted(self.results):
            ids = self.results[sid].prompt_token_ids
            if ids is not None:
                return list(ids)
        return []

    def final_output(self, error: OmniError | None = None, reason: str | None = None) -> OmniRequestOutput:
        """The one terminal output: everything the requested final stages produced."""
        out = OmniRequestOutput(self.request_id, finished=True, error=error)
        out.prompt_token_ids = self.prompt_token_ids()
        for sid in sorted(self.results):  # every stage's counts, a later stage's over an earlier one's
            counts = self.results[sid].token_counts
            out.token_counts = counts if out.token_counts is None else out.token_counts.merged(counts)
        finish_reasons = []
        for sid in sorted(self.finals):
            result = self.results[sid]
            modality = self.pipeline.stage(sid).output_modality
            out.data.update({k: v for k, v in result.data.items() if not isinstance(v, Payload)})
            if result.finish_reason:
                finish_reasons.append((modality, result.finish_reason))
            out.sample_rate = out.sample_rate or result.sample_rate
            out.fps = out.fps or result.fps
            out.progress = result.progress or out.progress
            out.metrics.update(result.metrics)
            if modality == "text":
                out.text, out.token_ids = result.text, list(result.token_ids)
                out.logprobs = list(result.logprobs)
                if sid in self.choices:
                    out.outputs["choices"] = self._choices(sid)
            # Read every chunk first: a chunk may still be a shared-memory reference.
            if result.image_chunks:
                out.images = images_from_tensor(self._joined(result.image_chunks))
            if result.video_chunks:
                out.video = self._joined(result.video_chunks)
            if result.code_chunks:
                out.outputs["codes"] = self._joined(result.code_chunks)
            for key, parts in result.chunks.items():
                out.outputs[key] = self._joined(parts)
        if self.audio:
            out.audio = torch.cat([a.reshape(-1) for a in self.audio])
        text_reason = [r for m, r in finish_reasons if m == "text"]
        out.finish_reason = reason or (text_reason or [r for _, r in finish_reasons] or [None])[-1]
        self.marks["e2e_s"] = time.monotonic() - self.arrival
        out.metrics.update(self.marks)
        return out

    def _joined(self, parts: list[Any]) -> Any:
        parts = [self.materialize(part) for part in parts]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)

    def _choices(self, sid: int) -> list[dict[str, Any]]:
        seqs = {0: self.results[sid], **self.choices.get(sid, {})}
        return [
            {
                "index": i,
                "text": r.text,
                "token_ids": list(r.token_ids),
                "finish_reason": (r.choice.finish_reason if r.choice else None) or r.finish_reason,
                "logprobs": list(r.logprobs),
            }
            for i, r in sorted(seqs.items())
        ]


def images_from_tensor(value: Any) -> list[Any]:
    """uint8 [N, H, W, C] (or [H, W, C]) → PIL images; float ones (`output_format: "tensor"`) stay
    tensors, one [H, W, C] an image."""
    from PIL import Image

    if isinstance(value, list):
        return value
    if value.ndim == 3:
        value = value[None]
    if isinstance(value, torch.Tensor) and value.dtype != torch.uint8:
        return list(value)
    array = value.numpy() if isinstance(value, torch.Tensor) else value
    return [Image.fromarray(a) for a in array]
