"""Sampling: seeded reproducibility whatever the batch holds, n > 1 conventions, the sampler's filters."""

from __future__ import annotations

import random
import time

import pytest
import torch

from omnistage.params import SamplingParams
from omnistage.stages.ar.sampler import ARGMAX_CHUNK, Sampler, row_argmax
from omnistage.stages.ar.sequence import ARRequest, Sequence
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run

SEEDED = SamplingParams(
    temperature=0.8,
    top_p=0.9,
    top_k=50,
    min_p=0.01,
    repetition_penalty=1.1,
    presence_penalty=0.2,
    frequency_penalty=0.1,
    seed=1234,
    max_tokens=20,
)


def others(rng: random.Random) -> list[StageRequest]:
    reqs = []
    for i in range(15):
        prompt = [rng.randrange(3, 500) for _ in range(rng.randint(2, 40))]
        kind = i % 3
        if kind == 0:
            params = SamplingParams(temperature=0.0, max_tokens=rng.randint(5, 25))
        elif kind == 1:
            params = SamplingParams(temperature=1.2, top_k=5, max_tokens=rng.randint(5, 25))  # unseeded
        else:
            params = SamplingParams(temperature=0.7, top_p=0.5, seed=i, max_tokens=rng.randint(5, 25))
        reqs.append(StageRequest(f"o{i}", prompt, params))
    return reqs


@pytest.mark.engine
def test_seeded_request_samples_the_same_alone_and_in_a_batch_of_16() -> None:
    prompt = [11, 22, 33, 44, 55, 66, 77]
    alone, _ = run(make_engine(), [StageRequest("x", prompt, SEEDED)])
    tokens = alone["x"].token_ids
    assert len(tokens) == 20 and len(set(tokens)) > 3  # really sampled, not a constant
    rng = random.Random(7)
    batch = others(rng)
    requests = batch[:6] + [StageRequest("x", prompt, SEEDED)] + batch[6:]
    arrivals = [0, 0, 0, 1, 1, 2, 3, 3, 4, 5, 5, 6, 7, 8, 9, 10]
    # a tight cache also forces preemptions, which must not disturb the seeded stream either
    per_block = 16 * 2 * 2 * 2 * 16 * 4
    engine = make_engine(kv_cache_bytes=17 * per_block)
    in_batch, _ = run(engine, requests, arrivals)
    assert in_batch["x"].token_ids == tokens
    assert engine.stats()["num_preemptions"] > 0 and engine.stats()["peak_running"] > 4


@pytest.mark.engine
def test_n_greater_than_one_outputs() -> None:
    params = SamplingParams(temperature=1.0, seed=5, n=3, max_tokens=6)
    results, deltas = run(make_engine(), [StageRequest("n3", [5, 6, 7, 8], params)])
    outs = deltas["n3"]
    assert all(o.choice is not None for o in outs)
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert sorted(o.choice.index for o in outs if o.choice.finished) == [0, 1, 2]
    assert all(o.choice.finish_reason == "length" for o in outs if o.choice.finished)
    assert outs[0].prompt_token_ids == [5, 6, 7, 8]
    per_index = {i: [t for o in outs if o.choice.index == i for t in o.token_ids] for i in range(3)}
    for i in range(3):  # sequence i draws from seed + i
        single = SamplingParams(temperature=1.0, seed=5 + i, max_tokens=6)
        alone, _ = run(make_engine(), [StageRequest("one", [5, 6, 7, 8], single)])
        assert per_index[i] == alone["one"].token_ids
    assert results["n3"].finish_reason == "length"


def _seq(params: SamplingParams, prompt: list[int] | None = None) -> Sequence:
    prompt = prompt or [1, 2, 3]
    request = ARRequest("u", prompt, params, 0, time.monotonic(), {})
    gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
    return Sequence(
        request=request, index=0, token_ids=list(prompt), max_tokens=10, detokenizer=None, generator=gen
    )


@pytest.mark.unit
@pytest.mark.parametrize(
    ("params", "allowed"),
    [
        (SamplingParams(top_k=2), {0, 1}),
        (SamplingParams(top_p=0.6), {0, 1}),  # probs ~ [.47, .29, .18, ...]: 0.47 < 0.6, 0.76 >= 0.6
        (SamplingParams(min_p=0.5), {0, 1}),
        (SamplingParams(allowed_token_ids=[3, 4]), {3, 4}),
        (SamplingParams(temperature=0.0), {0}),
    ],
)
def test_sampler_filters(params: SamplingParams, allowed: set[int]) -> None:
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -2.0]]).repeat(400, 1)
    seqs = [_seq(params) for _ in range(400)]
    drawn = set(Sampler([], seed=0)(logits, seqs).token_ids)
    assert drawn == allowed


@pytest.mark.unit
def test_sampler_frequencies_follow_the_tempered_softmax() -> None:
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5]]).repeat(4000, 1)
    tokens = Sampler([], seed=0)(
        logits, [_seq(SamplingParams(temperature=0.5)) for _ in range(4000)]
    ).token_ids
    freq = torch.bincount(torch.tensor(tokens), minlength=4).float() / 4000
    assert torch.allclose(freq, torch.softmax(logits[0] / 0.5, dim=-1), atol=0.03)


@pytest.mark.unit
def test_penalties() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    seq = _seq(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt=[0, 1])
    processed = Sampler([], seed=0)._process(logits, [seq])
    assert processed[0].tolist() == [1.0, -4.0, 1.0, 0.5]
    seq = _seq(SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25), prompt=[9])
    seq.token_ids += [2, 2, 3]
    processed = Sampler([], seed=0)._process(logits, [seq])
    assert processed[0].tolist() == pytest.approx([2.0, -2.0, 1.0 - 0.5 - 0.5, 0.5 - 0.25 - 0.5])


@pytest.mark.unit
def test_processing_a_batch_equals_processing_each_row_alone() -> None:
    """The min-tokens mask and repetition penalty run over the whole batch at once; every row must still
    come out exactly as it does alone, whatever its neighbours' settings."""
    rng = random.Random(0)
    settings = [
        SamplingParams(temperature=0.0, repetition_penalty=1.05, min_tokens=5, stop_token_ids=[7, 8]),
        SamplingParams(temperature=0.0, repetition_penalty=1.3),
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.0, repetition_penalty=1.05, allowed_token_ids=[1, 2, 3, 9, 40]),
        SamplingParams(temperature=0.0, repetition_penalty=1.2, presence_penalty=0.5, min_tokens=3),
        SamplingParams(temperature=0.0, min_tokens=4, stop_token_ids=[5]),
    ]
    seqs = [_seq(p, prompt=[rng.randrange(0, 64) for _ in range(20)]) for p in settings]
    for seq in seqs:
        seq.token_ids += [rng.randrange(0, 64) for _ in range(2)]
    logits = torch.randn(len(seqs), 64, generator=torch.Generator().manual_seed(0))
    sampler = Sampler([0], seed=0)
    batch = sampler._process(logits, seqs)
    for i, seq in enumerate(seqs):
        assert torch.equal(batch[i], sampler._process(logits[i : i + 1], [seq])[0])
    assert torch.equal(batch[2], logits[2])  # untouched settings leave the row as it was
    assert batch[0, 7] == batch[0, 8] == batch[4, 0] == batch[5, 5] == float("-inf")  # stops, EOS masked


@pytest.mark.unit
@pytest.mark.parametrize("width", [7, 4 * ARGMAX_CHUNK, 8448, 32000, 32003])
def test_row_argmax_is_torch_argmax(width: int) -> None:
    """The chunked argmax the sampler uses picks argmax's index: random rows, ties at the maximum (the first
    wins), NaN (argmax's maximum, the first wins), all -inf and constant rows, widths that are and are not
    a multiple of the chunk."""
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(9, width, generator=gen)
    x[1, width // 3] = x[1, width - 1] = x[1].max() + 1  # a tie
    x[2, width // 2] = float("nan")
    x[2, width - 1] = float("nan")
    x[3] = float("-inf")
    x[4] = 2.5
    x[5, 0] = 1e9
    x[6, width - 1] = 1e9
    x[7] = x[7].round()  # many ties below the maximum
    assert torch.equal(row_argmax(x), x.argmax(dim=-1))
