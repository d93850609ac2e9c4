"""A pipeline's stages chained by hand (engines and input processors in the test's process, no
orchestrator), so every stage's output can be compared with a reference: full handoff (the upstream
finished) and async chunk (the upstream's deltas arriving one at a time, as the worker feeds them)."""

from __future__ import annotations

from typing import Any

from omnistage.config.pipeline import PipelineSpec, load_ref
from omnistage.outputs import StageOutput, StageResult
from omnistage.stages.base import StageInputContext, StageRequest


def run_stage(
    pipeline: PipelineSpec, stage_id: int, engine: Any, prompt: Any, params: Any, results: dict, deltas=None
) -> StageResult:
    """Full handoff: the stage's request built from its finished upstream results, run to the end (its
    outputs also appended to `deltas`, when given)."""
    spec = pipeline.stage(stage_id)
    upstream = {i: results[i] for i in spec.inputs}
    ctx = StageInputContext("req", prompt, params, upstream, spec, engine.input_resources())
    engine.add_request(load_ref(spec.input_processor)(ctx))
    result = StageResult(stage_id=stage_id)
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            result.add(out)
            if deltas is not None:
                deltas.append(out)
    assert result.finished and engine.stats()["num_requests"] == 0
    return result


def stream_stage(
    pipeline: PipelineSpec, stage_id: int, engine: Any, prompt: Any, params: Any, chunks: list[StageOutput]
) -> tuple[StageResult, int]:
    """Async-chunk handoff as the worker does it: the upstream deltas arrive one at a time through the
    stage's chunk processor, and the engine runs whenever it can. Also returns how many outputs the stage
    had produced before its last input arrived."""
    spec = pipeline.stage(stage_id)
    source = spec.inputs[0]
    resources = engine.input_resources()
    ctx = StageInputContext("req", prompt, params, {source: StageResult(stage_id=source)}, spec, resources)
    result, early = StageResult(stage_id=stage_id), 0
    for i, chunk in enumerate(chunks):
        last = i == len(chunks) - 1
        ctx.upstream[source].add(chunk)
        made = spec.chunk_processor(ctx, chunk, last)
        if isinstance(made, StageRequest):
            made.streaming_input = not last
            engine.add_request(made)
        elif made is not None or last:
            engine.add_chunk("req", made or {}, last)
        while engine.has_work():
            for out in engine.step():
                assert out.error is None, out.error
                result.add(out)
                early += not last
    assert result.finished and engine.stats()["num_requests"] == 0
    return result, early
