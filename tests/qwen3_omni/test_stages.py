"""The three Qwen3-Omni stages chained by hand (engines and input processors in this process, no
orchestrator), so that every stage's output can be compared with the reference `generate`: thinker tokens,
the talker's 16-codebook frames, and the waveform in full-handoff and async-chunk mode."""

import pytest
import torch

from omnistage.config.deploy import resolve_deploy
from omnistage.config.pipeline import load_ref
from omnistage.outputs import StageOutput, StageResult
from omnistage.pipelines.qwen3_omni import QWEN3_OMNI
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.worker import create_engine
from tests.qwen3_omni.conftest import FRAMES, PROMPTS, greedy_params

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engines(omni3_dir):
    """thinker, talker, code2wav (full handoff), code2wav (async chunk, the default deploy's chunking)."""
    made = []
    for stage_id, async_chunk in ((0, None), (1, None), (2, False), (2, True)):
        deploy = resolve_deploy(QWEN3_OMNI, None, None, {str(stage_id): {"async_chunk": async_chunk}})
        made.append(create_engine(QWEN3_OMNI.stage(stage_id), deploy.stage(stage_id), str(omni3_dir), "cpu"))
    return made


def run_stage(stage_id, engine, prompt, params, results, deltas=None) -> StageResult:
    """Full handoff: the stage's request built from its finished upstream results, run to the end."""
    spec = QWEN3_OMNI.stage(stage_id)
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


def stream_stage(stage_id, engine, prompt, params, chunks: list[StageOutput]) -> tuple[StageResult, int]:
    """Async-chunk handoff as the worker does it: upstream deltas arrive one at a time through the chunk
    processor and the engine runs whenever it can. Also returns the outputs made before the last input."""
    spec = QWEN3_OMNI.stage(stage_id)
    source = spec.inputs[0]
    ctx = StageInputContext(
        "req", prompt, params, {source: StageResult(stage_id=source)}, spec, engine.input_resources()
    )
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


def frame_chunks(codes: torch.Tensor) -> list[StageOutput]:
    """The talker's frames as it streams them: one per step."""
    return [
        StageOutput("req", codes=codes[i : i + 1], finished=i == len(codes) - 1) for i in range(len(codes))
    ]


@pytest.mark.parametrize("name", list(PROMPTS))
def test_stage_outputs_equal_reference(name, engines, references):
    ref, prompt, params = references[name], PROMPTS[name], greedy_params()
    assert ref.codes.shape == (FRAMES, 16) and float(ref.waveform.std()) > 0.05  # audible, not ~1e-7
    results, thinker_deltas = {}, []
    results[0] = run_stage(0, engines[0], prompt, params[0], results, thinker_deltas)
    assert results[0].prompt_token_ids == ref.prompt_ids
    assert results[0].token_ids == ref.text_ids
    results[1] = run_stage(1, engines[1], prompt, params[1], results)
    assert results[1].token_ids == ref.talker_ids[:FRAMES]
    assert torch.equal(results[1].codes, ref.codes)

    # Async chunk into the talker: it starts while the thinker is still writing and, held back until each
    # text row has arrived, speaks exactly the same frames.
    assert len(thinker_deltas) == len(ref.text_ids)
    streamed, early = stream_stage(1, engines[1], prompt, params[1], thinker_deltas)
    assert torch.equal(streamed.codes, ref.codes)
    assert 0 < early < FRAMES

    full = run_stage(2, engines[2], prompt, params[2], results).audio
    assert full.shape == ref.waveform.shape
    assert float((full - ref.waveform).abs().max()) <= 1e-4

    passes = engines[3].passes
    chunked, _ = stream_stage(2, engines[3], prompt, params[2], frame_chunks(results[1].codes))
    assert engines[3].passes - passes >= 2  # decoded window by window while frames arrived
    assert chunked.audio.shape == ref.waveform.shape
    assert float((chunked.audio - ref.waveform).abs().max()) <= 1e-4
