"""The three stages chained by hand (engines and input processors in this process, no orchestrator), so
every stage's output can be compared with the reference: thinker text tokens, talker codec tokens, and the
waveform in full-handoff and async-chunk mode, for text, image, audio and video prompts."""

import pytest

from omnistage.config.deploy import resolve_deploy
from omnistage.families.qwen2_5_omni.pipeline import QWEN2_5_OMNI
from omnistage.outputs import StageOutput, StageResult
from omnistage.runtime.stage_process import create_engine
from tests.qwen2_5_omni.conftest import PROMPTS, assert_async_audio_close, greedy_params
from tests.support import stage_chain

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engines(omni_dir):
    """thinker, talker, code2wav (full handoff), code2wav (async chunk)."""
    made = []
    for stage_id, async_chunk in ((0, None), (1, None), (2, False), (2, True)):
        deploy = resolve_deploy(QWEN2_5_OMNI, None, None, {str(stage_id): {"async_chunk": async_chunk}})
        made.append(create_engine(QWEN2_5_OMNI.stage(stage_id), deploy.stage(stage_id), str(omni_dir), "cpu"))
    return made


def run_stage(stage_id, engine, prompt, params, results, deltas=None) -> StageResult:
    return stage_chain.run_stage(QWEN2_5_OMNI, stage_id, engine, prompt, params, results, deltas)


def stream_stage(stage_id, engine, prompt, params, chunks: list[StageOutput]) -> tuple[StageResult, int]:
    return stage_chain.stream_stage(QWEN2_5_OMNI, stage_id, engine, prompt, params, chunks)


def code_chunks(codes: list[int]) -> list[StageOutput]:
    """The talker's codes as it streams them: one per step."""
    return [StageOutput("req", token_ids=[t], finished=i == len(codes) - 1) for i, t in enumerate(codes)]


@pytest.mark.parametrize("name", list(PROMPTS))
def test_stage_outputs_equal_reference(name, engines, references, omni_dir):
    ref, prompt, params = references[name], PROMPTS[name], greedy_params()
    results, thinker_deltas = {}, []
    results[0] = run_stage(0, engines[0], prompt, params[0], results, thinker_deltas)
    assert results[0].prompt_token_ids == ref.prompt_ids
    assert results[0].token_ids == ref.text_ids
    results[1] = run_stage(1, engines[1], prompt, params[1], results)
    assert results[1].token_ids == ref.talker_ids
    assert len(ref.codes) > 24  # enough codes for several async chunks

    # Async chunk into the talker: it starts while the thinker is still writing and, held back until each
    # reply row has arrived, speaks exactly the same codes.
    assert len(thinker_deltas) == len(ref.text_ids)  # one delta per thinker token
    streamed, early = stream_stage(1, engines[1], prompt, params[1], thinker_deltas)
    assert streamed.token_ids == ref.talker_ids
    assert 0 < early < len(ref.talker_ids)

    full = run_stage(2, engines[2], prompt, params[2], results).audio
    assert full.shape == ref.waveform.shape
    assert float((full - ref.waveform).abs().max()) <= 1e-4

    passes = engines[3].passes
    chunked, _ = stream_stage(2, engines[3], prompt, params[2], code_chunks(results[1].token_ids))
    chunked = chunked.audio
    assert engines[3].passes - passes >= 2  # decoded window by window while codes arrived
    assert_async_audio_close(chunked, ref.waveform, omni_dir)


def test_thinker_returns_every_hidden_row_despite_a_cached_prefix(engines):
    """Requests sharing the system prompt: the second must not skip computing (and returning) its cached
    prefix, or the talker would miss rows."""
    thinker = engines[0]
    for prompt in ("Hello there", "Hello again"):
        result = run_stage(0, thinker, prompt, greedy_params()[0], {})
        rows = result.hidden(-1).shape[0]
        assert rows == len(result.prompt_token_ids) + len(result.token_ids) - 1
    assert thinker.stats()["prefix_cache_queries"] > 0
