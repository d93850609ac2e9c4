"""The post-sample hook: a toy code predictor fills in a frame's other codebooks after each step's sampling
and makes the next step's input, batched over the step's sequences, with the results each sequence gets
alone in the engine, and through transformers alone."""

from __future__ import annotations

import pytest
import torch

from omnistage.params import SamplingParams
from omnistage.stages.ar.post_sample import PostSample
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import (
    CODEBOOKS,
    hf_greedy,
    make_engine,
    predict_codes,
    reference_talker,
    run,
    step_rows,
)
from tests.ar.test_greedy import workload

pytestmark = pytest.mark.engine

MAX_NEW = 16
TALKER = {
    "model_loader": "tests.ar.ar_helpers:load_toy_talker",
    "post_sample_hook": "tests.ar.ar_helpers:predict_codes",
}


def talker(**deploy) -> object:
    engine_args = {**TALKER, "block_size": 8, **deploy.pop("engine_args", {})}
    return make_engine("qwen2", engine_args=engine_args, **deploy)


def requests(prompts: list[list[int]], explode: set[int] = frozenset()) -> list[StageRequest]:
    return [
        StageRequest(
            f"r{i}",
            prompt=p,
            params=SamplingParams(temperature=0.0, max_tokens=MAX_NEW),
            inputs=step_rows(explode=True) if i in explode else None,
        )
        for i, p in enumerate(prompts)
    ]


def alone(prompts: list[list[int]]) -> dict[str, tuple[list[int], torch.Tensor]]:
    """Each request by itself in an engine of its own."""
    out = {}
    for req in requests(prompts):
        results, _ = run(talker(), [req])
        out[req.request_id] = (results[req.request_id].token_ids, results[req.request_id].codes)
    return out


@pytest.mark.parametrize("mode", ["prefix_cache", "preemption"])
def test_batched_hook_equals_each_sequence_alone(mode: str) -> None:
    """8 sequences arriving at different steps, one hook call per step over all of them: every request's
    tokens and [1, 4] frames per step equal what it gets alone. Under preemption the recomputed sequences
    are refilled with the embeddings the hook made (a token-embedding refill would change what follows)."""
    prompts, arrivals = workload()
    prompts, arrivals = prompts[:8], [0, 0, 1, 3, 4, 6, 9, 11]
    deploy = {}
    if mode == "preemption":
        deploy["kv_cache_bytes"] = 17 * 8 * 2 * 2 * 2 * 16 * 4  # 16 usable blocks of 8 tokens for 8 sequences
    engine = talker(**deploy)
    calls: list[int] = []
    hook = engine.post_sample
    engine.post_sample = lambda model, step: calls.append(len(step.steps)) or hook(model, step)
    results, deltas = run(engine, requests(prompts), arrivals)
    solo = alone(prompts)
    for rid, (tokens, codes) in solo.items():
        got = results[rid]
        assert got.token_ids == tokens, rid
        assert got.codes.shape == (len(tokens), CODEBOOKS) and got.codes.dtype == torch.long
        assert got.codes[:, 0].tolist() == tokens
        assert torch.equal(got.codes, codes), rid
        assert all(d.codes is None or d.codes.shape[0] == len(d.token_ids) for d in deltas[rid])
    assert max(calls) > 1 and sum(calls) == sum(len(r.token_ids) for r in results.values())
    stats = engine.stats()
    assert stats["peak_running"] > 1 and stats["kv_blocks_free"] == stats["kv_blocks_total"]
    if mode == "preemption":
        assert stats["num_preemptions"] > 0
    else:
        assert stats["prefix_cache_hits"] > 0  # the shared system prompt; generated positions never are


def test_hook_embeddings_are_what_the_model_is_fed() -> None:
    """The engine's tokens and frames equal transformers' own forward fed the same embeddings, and differ
    from plain greedy decoding (so the fed-back embeddings are really used)."""
    prompts, _ = workload(seed=3)
    prompts = prompts[:2]
    results, _ = run(talker(), requests(prompts))
    for i, prompt in enumerate(prompts):
        tokens, frames = reference_talker("qwen2", prompt, MAX_NEW)
        assert results[f"r{i}"].token_ids == tokens
        assert torch.equal(results[f"r{i}"].codes, frames)
    assert any(
        results[f"r{i}"].token_ids != hf_greedy("qwen2", tuple(p), MAX_NEW) for i, p in enumerate(prompts)
    )


def test_hook_failure_fails_only_its_request() -> None:
    """The hook raises for one request's sequences: that request ends with an error naming the cause, the
    batch is retried one sequence at a time, and the others equal their runs alone."""
    prompts, _ = workload(seed=4)
    prompts = prompts[:4]
    results, deltas = run(talker(), requests(prompts, explode={2}))
    assert results["r2"].finish_reason == "error"
    assert "code predictor exploded" in deltas["r2"][-1].error
    solo = alone(prompts)
    for rid in ("r0", "r1", "r3"):
        assert results[rid].finish_reason in ("stop", "length")
        assert results[rid].token_ids == solo[rid][0]
        assert torch.equal(results[rid].codes, solo[rid][1])


def test_no_hook_no_codes() -> None:
    """Without a hook a step emits no codes and feeds back token embeddings (plain greedy)."""
    prompts, _ = workload()
    results, _ = run(make_engine("qwen2"), requests(prompts[:2]))
    for i, p in enumerate(prompts[:2]):
        assert results[f"r{i}"].codes is None
        assert results[f"r{i}"].token_ids == hf_greedy("qwen2", tuple(p), MAX_NEW)


def stop_from_step_5(model, step) -> PostSample:
    """The toy hook, whose frames end their sequence from generated step 5 on (a family's own stop)."""
    out = predict_codes(model, step)
    out.stop = torch.tensor([s >= 5 for s in step.steps])
    return out


CASES = [({}, 6, "stop"), ({"min_tokens": 9}, 9, "stop"), ({"ignore_eos": True}, MAX_NEW, "length")]


@pytest.mark.parametrize(("fields", "length", "reason"), CASES)
def test_a_hook_can_end_a_sequence_as_an_eos_would(fields: dict, length: int, reason: str) -> None:
    """A hook's `stop` ends the sequence with the frame it marks, minding min_tokens and ignore_eos as an
    EOS token; the engine frees its KV."""
    engine = talker(engine_args={"post_sample_hook": stop_from_step_5})
    prompts, _ = workload(seed=5)
    reqs = requests(prompts[:4])
    for req in reqs:
        req.params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, **fields)
    results, _ = run(engine, reqs)
    ended = 0
    for req in reqs:
        got = results[req.request_id]
        if len(got.token_ids) < length and "ignore_eos" not in fields:
            continue  # the model's own EOS came first: not this test's subject
        ended += 1
        assert len(got.token_ids) == length and got.codes.shape[0] == length, req.request_id
        assert got.finish_reason == reason
    assert ended >= 2
    stats = engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def choose_whole_frame(model, step) -> PostSample:
    """The toy hook, picking the frame itself: the sampled token's codes reversed as the frame, and the
    frame's last code as the token the step appends."""
    out = predict_codes(model, step)
    frames = torch.cat([step.token_ids[:, None], out.codes], dim=1).flip(1)
    return PostSample(frames=frames, next_embeds=out.next_embeds, token_ids=frames[:, -1] + 1)


def test_a_hook_can_pick_the_frame_and_the_token_itself() -> None:
    """`frames` are emitted as the hook made them and `token_ids` replace the sampled tokens; the fed
    embeddings are the hook's, so what is sampled next is what the same hook alone gives."""
    prompts, _ = workload(seed=6)
    engine = talker(engine_args={"post_sample_hook": choose_whole_frame})
    results, deltas = run(engine, requests(prompts[:3]))
    plain, _ = run(talker(), requests(prompts[:3]))
    for rid, got in results.items():
        want = plain[rid]
        steps = min(len(got.token_ids), len(want.token_ids))
        assert steps >= 2 and torch.equal(got.codes[:steps], want.codes[:steps].flip(1))
        assert got.token_ids[:steps] == [t + 1 for t in want.token_ids[:steps]]
        assert all(d.codes is None or d.codes.shape[0] == len(d.token_ids) for d in deltas[rid])
