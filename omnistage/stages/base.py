"""The contract every stage engine meets, and what the worker hands it.

Engines are synchronous and single-threaded: the worker loop owns all I/O and calls `step()` while
`has_work()`; an engine never touches sockets, connectors or other stages.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from omnistage.outputs import StageOutput, StageResult, TokenCounts
from omnistage.prompts import Prompt, as_prompt

if TYPE_CHECKING:
    from omnistage.config.deploy import StageDeploy
    from omnistage.config.pipeline import StageSpec


@dataclasses.dataclass
class StageRequest:
    """One request as a stage engine sees it, built by the stage's input processor.

    `streaming_input=True` means more input arrives later through `add_chunk` (async-chunk handoff); the
    engine parks the request while it has nothing to work on.
    """

    request_id: str
    prompt: Any = None
    params: Any = None
    # The engine's typed inputs (ARInputs, GenerationInputs; stages/typed_inputs.py): None, the defaults.
    inputs: Any = None
    streaming_input: bool = False
    priority: int = 0
    # What this request counts toward usage when its prompt is not the user's input (outputs.TokenCounts);
    # the engine sends it with the request's first output.
    token_counts: TokenCounts | None = None
    arrival_time: float = dataclasses.field(default_factory=time.monotonic)


@runtime_checkable
class StageEngine(Protocol):
    def add_request(self, request: StageRequest) -> None: ...

    def add_chunk(self, request_id: str, inputs: Any, last: bool) -> None:
        """More input for a request added with `streaming_input=True` (the engine's inputs struct with the
        new parts set, or None: nothing new, e.g. only the news that the input is complete)."""
        ...

    def abort(self, request_id: str) -> None:
        """Forget the request; an aborted request produces no further outputs."""
        ...

    def step(self) -> list[StageOutput]:
        """One scheduling iteration. Outputs are deltas; a request's last output has `finished=True`."""
        ...

    def has_work(self) -> bool: ...

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self) -> None: ...

    def input_resources(self) -> Any:
        """What the stage's input processors may use (see StageInputContext.resources); engines that lend
        nothing may omit it."""
        ...

    def stats(self) -> dict[str, Any]:
        """At least `num_requests`: how many requests the engine holds (waiting, running or parked)."""
        ...

    def shutdown(self) -> None:
        """Release what the engine holds (requests, caches, helper processes); the worker calls it once, as
        it exits, and never calls the engine again."""
        ...


@dataclasses.dataclass
class StageInputContext:
    """What a stage's input processor (or chunk processor) sees.

    `upstream` holds the accumulated results of the stage's input stages (all finished, in full handoff;
    the producing stage so far, in async-chunk handoff); `upstream_choices` an input stage's other
    sequences of a request with n > 1 (index 1 on, full handoff). `state` is per-request scratch that survives
    between chunk-processor calls. `resources` is what the stage's engine lends its processors
    (`engine.input_resources()`: the family's loaded model with its tokenizer and processor, a generator):
    a family's processors read their own model's parts there, never the engine's internals. `modalities`:
    what the request asked the pipeline for (its final stages' outputs; empty where unknown, e.g. a direct
    engine user), for a stage that works differently per answer (Janus: text, or an image's tokens).
    """

    request_id: str
    prompt: Prompt | None
    params: Any
    upstream: dict[int, StageResult]
    stage: StageSpec
    resources: Any = None
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    upstream_choices: dict[int, list[StageResult]] = dataclasses.field(default_factory=dict)
    modalities: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt is not None:  # typed for every processor, whatever a direct engine user passed
            self.prompt = as_prompt(self.prompt)


@dataclasses.dataclass
class EngineContext:
    """What an engine factory receives: the stage's topology entry, its resolved deploy settings and
    where its model lives."""

    stage: StageSpec
    deploy: StageDeploy
    model_dir: str | None
    device: str = "cpu"

    @property
    def engine_args(self) -> dict[str, Any]:
        return self.deploy.engine_args
