"""The three stages chained by hand (engines and input processors in this process, no orchestrator), so
every stage's output can be compared with the reference: thinker text tokens, talker codec tokens, and the
waveform in full-handoff and async-chunk mode, for text, image, audio and video prompts."""

import pytest

from omnistage.config.deploy import resolve_deploy
from omnistage.config.pipeline import load_ref
from omnistage.outputs import StageOutput, StageResult
from omnistage.pipelines.qwen2_5_omni import QWEN2_5_OMNI
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.worker import create_engine
from tests.omni.conftest import ASYNC_TOLERANCE, PROMPTS, greedy_params

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engines(omni_dir):
    """thinker, talker, code2wav (full handoff), code2wav (async chunk)."""
    made = []
    for stage_id, async_chunk in ((0, None), (1, None), (2, False), (2, True)):
        deploy = resolve_deploy(QWEN2_5_OMNI, None, None, {str(stage_id): {"async_chunk": async_chunk}})
        made.append(create_engine(QWEN2_5_OMNI.stage(stage_id), deploy.stage(stage_id), str(omni_dir), "cpu"))
    return made


def run_stage(stage_id, engine, prompt, params, results) -> StageResult:
    spec = QWEN2_5_OMNI.stage(stage_id)
    upstream = {i: results[i] for i in spec.inputs}
    ctx = StageInputContext("req", prompt, params, upstream, spec, engine)
    engine.add_request(load_ref(spec.input_processor)(ctx))
    result = StageResult(stage_id=stage_id)
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            result.add(out)
    assert result.finished and engine.stats()["num_requests"] == 0
    return result


def stream_codes(engine, prompt, params, codes: list[int]) -> StageResult:
    """Async-chunk handoff as the worker does it: the talker's tokens arrive one per step through the
    code2wav chunk processor, and the engine runs whenever it can."""
    spec = QWEN2_5_OMNI.stage(2)
    ctx = StageInputContext("req", prompt, params, {1: StageResult(stage_id=1)}, spec, engine)
    result = StageResult(stage_id=2)
    for i, token in enumerate(codes):
        last = i == len(codes) - 1
        made = spec.chunk_processor(ctx, StageOutput("req", token_ids=[token], finished=last), last)
        if isinstance(made, StageRequest):
            made.streaming_input = not last
            engine.add_request(made)
        elif made is not None or last:
            engine.add_chunk("req", made or {}, last)
        while engine.has_work():
            for out in engine.step():
                result.add(out)
    assert result.finished
    return result


@pytest.mark.parametrize("name", list(PROMPTS))
def test_stage_outputs_equal_reference(name, engines, references):
    ref, prompt, params = references[name], PROMPTS[name], greedy_params()
    results = {}
    results[0] = run_stage(0, engines[0], prompt, params[0], results)
    assert results[0].data["prompt_token_ids"] == ref.prompt_ids
    assert results[0].token_ids == ref.text_ids
    results[1] = run_stage(1, engines[1], prompt, params[1], results)
    assert results[1].token_ids == ref.talker_ids
    assert len(ref.codes) > 24  # enough codes for several async chunks

    full = run_stage(2, engines[2], prompt, params[2], results).tensor("audio")
    assert full.shape == ref.waveform.shape
    assert float((full - ref.waveform).abs().max()) <= 1e-4

    passes = engines[3].passes
    chunked = stream_codes(engines[3], prompt, params[2], results[1].token_ids).tensor("audio")
    assert engines[3].passes - passes >= 2  # decoded window by window while codes arrived
    assert chunked.shape == ref.waveform.shape
    assert float((chunked - ref.waveform).abs().max()) <= ASYNC_TOLERANCE


def test_thinker_returns_every_hidden_row_despite_a_cached_prefix(engines):
    """Requests sharing the system prompt: the second must not skip computing (and returning) its cached
    prefix, or the talker would miss rows."""
    thinker = engines[0]
    for prompt in ("Hello there", "Hello again"):
        result = run_stage(0, thinker, prompt, greedy_params()[0], {})
        rows = result.tensor("hidden_states").shape[0]
        assert rows == len(result.data["prompt_token_ids"]) + len(result.token_ids) - 1
    assert thinker.stats()["prefix_cache_queries"] > 0
