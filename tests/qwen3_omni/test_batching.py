"""The Qwen3-Omni talker batches: 8 requests arriving at different steps give each the frames it gets
alone (greedy: the reference's; seeded sampling: its own solo run), so the code predictor's batched
post-sample hook and the per-request text rows never mix requests."""

import pytest
import torch

from omnistage import SamplingParams
from omnistage.config.pipeline import load_ref
from omnistage.families.qwen3_omni.pipeline import QWEN3_OMNI
from omnistage.outputs import StageResult
from omnistage.stages.base import StageInputContext
from tests.qwen3_omni.conftest import FRAMES, PROMPTS

pytestmark = pytest.mark.engine

NAMES = list(PROMPTS)


def talker_request(engine, rid, name, params, thinker_results):
    spec = QWEN3_OMNI.stage(1)
    ctx = StageInputContext(
        rid, PROMPTS[name], params, {0: thinker_results[name]}, spec, engine.input_resources()
    )
    return load_ref(spec.input_processor)(ctx)


def run_staggered(engine, requests) -> dict[str, StageResult]:
    """Request i joins after i steps of the engine; every request runs to its end."""
    results = {r.request_id: StageResult(stage_id=1) for r in requests}
    pending = list(requests)
    for _ in range(10 * FRAMES * len(requests)):
        if pending:
            engine.add_request(pending.pop(0))
        for out in engine.step():
            assert out.error is None, out.error
            results[out.request_id].add(out)
        if not pending and not engine.has_work():
            break
    assert all(r.finished for r in results.values()) and engine.stats()["num_requests"] == 0
    return results


def test_greedy_batched_equals_reference(engines, references, thinker_results):
    talker = engines[1]
    params = SamplingParams(temperature=0.0, max_tokens=FRAMES, repetition_penalty=1.05)
    requests = [
        talker_request(talker, f"g{i}", NAMES[i % len(NAMES)], params, thinker_results) for i in range(8)
    ]
    results = run_staggered(talker, requests)
    for i in range(8):
        assert torch.equal(results[f"g{i}"].codes, references[NAMES[i % len(NAMES)]].codes), i


def test_seeded_batched_equals_solo(engines, thinker_results):
    """Sampled with the reference's talker defaults (temperature 0.9, top-k 50, repetition penalty 1.05),
    one seed per request; four (prompt, seed) pairs, each twice in the batch."""
    talker = engines[1]

    def params(seed):
        return SamplingParams(temperature=0.9, top_k=50, repetition_penalty=1.05, max_tokens=12, seed=seed)

    pairs = [(NAMES[i % 2], i % 4) for i in range(8)]
    solo = {}
    for name, seed in sorted(set(pairs)):
        one = talker_request(talker, "solo", name, params(seed), thinker_results)
        solo[name, seed] = run_staggered(talker, [one])["solo"].codes
    assert len({tuple(c.flatten().tolist()) for c in solo.values()}) == len(solo)  # the seeds matter
    batch = [talker_request(talker, f"s{i}", n, params(s), thinker_results) for i, (n, s) in enumerate(pairs)]
    results = run_staggered(talker, batch)
    for i, pair in enumerate(pairs):
        assert torch.equal(results[f"s{i}"].codes, solo[pair]), i
