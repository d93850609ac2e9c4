"""Structured outputs on the AR engine: constrained and unconstrained sequences batched together, arriving
at different steps, each decode exactly what it decodes alone (greedy), the constrained ones within their
grammar; a request with n sequences keeps a grammar state per sequence."""

from __future__ import annotations

import re

import pytest

from omnistage.params import SamplingParams, StructuredOutputs
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run

pytestmark = pytest.mark.engine

PROMPTS = [[5, 9, 14, 3, 27], [8, 8, 31, 2], [40, 7, 19, 23, 6, 11], [12, 33, 4]]
CONSTRAINTS = [
    StructuredOutputs(regex="[a-z]{3,8}-[0-9]{2,4}"),
    None,
    StructuredOutputs(choice=["north", "south", "east", "west"]),
    None,
]


def request(rid: str, i: int, n: int = 1) -> StageRequest:
    params = SamplingParams(temperature=0, max_tokens=12, structured_outputs=CONSTRAINTS[i], n=n)
    return StageRequest(rid, PROMPTS[i], params)


def test_constrained_and_free_sequences_batched_equal_their_solo_outputs() -> None:
    engine = make_engine()
    solo = {}
    for i in range(len(PROMPTS)):
        results, _ = run(engine, [request(f"solo{i}", i)])
        solo[i] = results[f"solo{i}"]
    assert re.fullmatch("[a-z]{3,8}-[0-9]{2,4}", solo[0].text), solo[0].text
    assert solo[2].text in ("north", "south", "east", "west")
    assert solo[1].text != solo[0].text and len(solo[1].token_ids) == 12  # the free ones run on
    results, _ = run(engine, [request(f"b{i}", i) for i in range(len(PROMPTS))], [0, 1, 1, 3])
    for i in range(len(PROMPTS)):
        assert results[f"b{i}"].token_ids == solo[i].token_ids, i
    stats = engine.stats()
    assert stats["peak_running"] >= 3 and stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_each_of_n_sequences_keeps_its_own_grammar_state() -> None:
    engine = make_engine()
    params = SamplingParams(
        temperature=1.0,
        seed=3,
        max_tokens=16,
        n=4,
        structured_outputs=StructuredOutputs(regex="(ab|cd){2,5}"),
    )
    results, deltas = run(engine, [StageRequest("n4", PROMPTS[0], params)])
    texts = {}
    for out in deltas["n4"]:
        index = out.choice.index if out.choice else 0
        texts[index] = texts.get(index, "") + out.text
    assert len(texts) == 4 and all(re.fullmatch("(ab|cd){2,5}", t) for t in texts.values()), texts
