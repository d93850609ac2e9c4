"""Base voice cloning, x-vector-only mode: the speaker encoder's x-vector of a reference clip equals the
reference's, and the talker given it speaks the reference's greedy codes (all 16 codebooks), each request
alone and 8 batched, arriving at different steps."""

from __future__ import annotations

import math

import pytest
import torch

from omnistage.families.qwen3_tts.prompt import talker_prompt
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import run
from tests.qwen3_tts.reference_outputs import reference_clone, tiny_dir
from tests.qwen3_tts.test_talker import MAX_NEW, assistant, frames, talker, talker_params

pytestmark = pytest.mark.engine

TEXTS = [([100, 2000, 30000, 555], "english"), ([9, 80000, 4, 17, 300], "auto"), ([42, 4242], "chinese"),
         ([7, 77, 777, 7777, 77777, 5], "japanese")]  # fmt: skip


def clip(seed: int, seconds: float) -> torch.Tensor:
    """A 24 kHz clip: two tones and a little noise, well inside [-1, 1]."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(int(24000 * seconds)) / 24000
    f1, f2 = 120 + 40 * seed, 700 + 90 * seed
    wave = 0.3 * torch.sin(2 * math.pi * f1 * t) + 0.2 * torch.sin(2 * math.pi * f2 * t)
    return wave + 0.05 * torch.randn(t.shape, generator=g)


def test_x_vector_clone_equals_reference() -> None:
    model_dir = tiny_dir("base")
    clips = [clip(i, 1.0 + 0.25 * i) for i in range(len(TEXTS))]
    requests = [
        {"input_ids": assistant(text), "language": lang, "non_streaming_mode": False, "max_new_tokens": n}
        for (text, lang), n in zip(TEXTS, [MAX_NEW] * len(TEXTS), strict=True)
    ]  # Base defaults to streaming text input (one text token a frame)
    expected = reference_clone(model_dir, requests, clips)
    engine = talker("base")
    loaded = engine.input_resources()
    xvectors = [loaded.speaker_encoder.embed(c) for c in clips]
    for mine, ref in zip(xvectors, expected["xvectors"], strict=True):
        assert mine.shape == ref.shape == (32,) and float((mine - ref).abs().max()) <= 1e-4

    def stage_requests(order: list[int]) -> list[StageRequest]:
        out = []
        for n, i in enumerate(order):
            req = requests[i]
            ids, inputs = talker_prompt(
                loaded, req["input_ids"], None, req["language"], None, False, speaker_embed=xvectors[i]
            )
            out.append(StageRequest(f"r{n}", prompt=ids, params=talker_params(), inputs=inputs))
        return out

    for i in range(len(requests)):
        results, _ = run(talker("base"), stage_requests([i]))
        assert torch.equal(frames(results["r0"]), expected["codes"][i]), i
    order = [0, 1, 2, 3, 3, 2, 1, 0]
    results, _ = run(engine, stage_requests(order), [0, 0, 1, 3, 4, 6, 9, 11])
    for n, i in enumerate(order):
        assert torch.equal(frames(results[f"r{n}"]), expected["codes"][i]), (n, i)
    assert any(len(c) > 2 for c in expected["codes"])
