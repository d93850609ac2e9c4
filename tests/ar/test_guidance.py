"""Classifier-free guidance on the AR engine (stages/ar/guidance.py): a guided request runs beside its
unconditional twin, scheduled as one. Greedy tokens equal transformers' `generate(guidance_scale=...,
negative_prompt_ids=...)` (its unbatched CFG: the same argmax as the engine's combination of raw logits),
alone, batched with unguided requests arriving at different steps, with the prefix cache on and under
forced preemption; a seeded guided request samples the same tokens alone and batched; the twin's blocks come
back; a twin prompt of another length is a 400 naming guidance."""

from __future__ import annotations

import random

import pytest
import torch

from omnistage.params import SamplingParams
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.guidance import Guidance
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import hf_model, make_engine, run

pytestmark = pytest.mark.engine

ARCH = "qwen2"
MAX_NEW = 16
SCALE = 3.0
PAD = 0


def prompts() -> list[list[int]]:
    rng = random.Random(3)
    system = [rng.randrange(3, 500) for _ in range(20)]
    return [system + [rng.randrange(3, 500) for _ in range(rng.randint(2, 12))] for _ in range(4)]


def unconditional(prompt: list[int]) -> list[int]:
    """Janus' way: the prompt's tokens but its first replaced by pads (same length)."""
    return [prompt[0]] + [PAD] * (len(prompt) - 1)


def reference(prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        out = hf_model(ARCH).generate(
            torch.tensor([prompt]),
            negative_prompt_ids=torch.tensor([unconditional(prompt)]),
            guidance_scale=SCALE,
            max_new_tokens=MAX_NEW,
            do_sample=False,
            attention_mask=None,
        )
    return out[0, len(prompt) :].tolist()


def unguided_reference(prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        out = hf_model(ARCH).generate(
            torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False, attention_mask=None
        )
    return out[0, len(prompt) :].tolist()


def request(rid: str, prompt: list[int], guided: bool = True, params: SamplingParams | None = None):
    inputs = ARInputs(guidance=Guidance(SCALE, prompt_token_ids=unconditional(prompt)) if guided else None)
    params = params or SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    return StageRequest(rid, prompt=prompt, params=params, inputs=inputs)


def test_guided_greedy_equals_transformers_alone_and_batched() -> None:
    ps = prompts()
    want = [reference(p) for p in ps]
    plain = [unguided_reference(p) for p in ps]
    assert all(len(w) == MAX_NEW for w in want) and want != plain
    for i, p in enumerate(ps):
        results, _ = run(make_engine(ARCH), [request("r", p)])
        assert results["r"].token_ids == want[i], i
    batch = [request(f"g{i}", p) for i, p in enumerate(ps)] + [
        request(f"u{i}", p, guided=False) for i, p in enumerate(ps)
    ]
    arrivals = [0, 1, 1, 3, 0, 2, 4, 5]
    for deploy in ({}, {"kv_cache_bytes": 2 * 2 * 2 * 16 * 4 * 16 * 13}):
        engine = make_engine(ARCH, engine_args={"block_size": 16}, **deploy)
        results, _ = run(engine, batch, arrivals)
        for i in range(len(ps)):
            assert results[f"g{i}"].token_ids == want[i], (deploy, i)
            assert results[f"u{i}"].token_ids == plain[i][: len(results[f"u{i}"].token_ids)], (deploy, i)
        stats = engine.stats()
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
        if deploy:
            assert stats["num_preemptions"] > 0
        else:
            assert stats["prefix_cache_hits"] > 0  # the shared system prompt, twins' pads too


def test_seeded_guided_sampling_alone_equals_batched() -> None:
    ps = prompts()
    params = SamplingParams(temperature=1.0, top_k=20, seed=11, max_tokens=MAX_NEW, ignore_eos=True)
    alone, _ = run(make_engine(ARCH), [request("r", ps[0], params=params)])
    batch = [request("r", ps[0], params=params)] + [request(f"o{i}", p) for i, p in enumerate(ps[1:])]
    engine = make_engine(ARCH, engine_args={"block_size": 16}, kv_cache_bytes=2 * 2 * 2 * 16 * 4 * 16 * 9)
    mixed, _ = run(engine, batch, [2, 0, 0, 1])
    assert mixed["r"].token_ids == alone["r"].token_ids and engine.stats()["num_preemptions"] > 0


def test_a_twin_prompt_of_another_length_is_refused() -> None:
    p = prompts()[0]
    bad = StageRequest(
        "r", prompt=p, params=SamplingParams(max_tokens=4), inputs=ARInputs(guidance=Guidance(2.0, [PAD]))
    )
    _, deltas = run(make_engine(ARCH), [bad])
    (refused,) = deltas["r"]
    assert refused.finish_reason == "error" and refused.error_param == "guidance"
