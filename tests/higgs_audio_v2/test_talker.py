"""Higgs Audio v2's DualFFN decoder on the AR engine, every codebook picked in the post-sample hook: greedy
frames and appended tokens equal the reference's `generate` for each prompt (a voice-cloning prompt too),
alone and 8 batched arriving at different steps, under the prefix cache and under forced preemption; seeded
sampling gives a request the same frames alone and batched."""

from __future__ import annotations

import msgspec
import pytest
import torch

from omnistage.families.higgs_audio_v2.talker import HiggsSpeech, prompt_inputs, speech_state
from omnistage.families.higgs_audio_v2.tiny import tiny_higgs_dir
from omnistage.params import SamplingParams
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run
from tests.higgs_audio_v2.reference import (
    CLONE,
    MAX_NEW,
    PROMPTS,
    reference_codes,
    reference_inputs,
    reference_tokens,
)

pytestmark = pytest.mark.engine

TALKER = {
    "model_loader": "omnistage.families.higgs_audio_v2.talker:load_talker",
    "post_sample_hook": "omnistage.families.higgs_audio_v2.talker:frame_codes",
}
# 2 layers x 2 KV heads x 16 dims x (K, V) x 4 bytes a token, 8-token blocks: 20 usable blocks for 8
# requests of ~80 tokens
SMALL_KV = 21 * 8 * 2 * 2 * 2 * 16 * 4


def talker(**deploy):
    from omnistage.families.higgs_audio_v2 import register

    register()  # the family's extra-input builder
    return make_engine(model_dir=str(tiny_higgs_dir()), engine_args={**TALKER, "block_size": 8}, **deploy)


def requests(engine, prompts, params: SamplingParams | None = None) -> list[StageRequest]:
    loaded = engine.input_resources()
    out = []
    for i, prompt in enumerate(prompts):
        ref = reference_inputs(*prompt)
        ids = ref["input_ids"][0].tolist()
        params_i = params or SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
        inputs = prompt_inputs(loaded, ids, ref.get("audio_input_ids"), ref.get("audio_input_ids_mask"))
        inputs.extension = speech_state(loaded.higgs_config, ids, params_i)
        out.append(StageRequest(f"r{i}", prompt=ids, params=params_i, inputs=inputs))
    return out


def test_greedy_codes_equal_reference_alone_and_batched() -> None:
    prompts = [*PROMPTS, CLONE]
    expected = [reference_codes(*p) for p in prompts]
    lengths = [len(e) for e in expected]
    assert min(lengths) < MAX_NEW and max(lengths) == MAX_NEW, lengths  # both ends: all-EOS and the limit
    for i, prompt in enumerate(prompts):
        engine = talker()
        results, _ = run(engine, requests(engine, [prompt]))
        assert torch.equal(results["r0"].codes, expected[i]), i
        assert results["r0"].token_ids == reference_tokens(*prompt), i  # audio / delay tokens, then EOS
    batch = PROMPTS + PROMPTS[::-1]
    for mode, deploy in [("prefix_cache", {}), ("preemption", {"kv_cache_bytes": SMALL_KV})]:
        engine = talker(**deploy)
        results, _ = run(engine, requests(engine, batch), [0, 0, 1, 3, 4, 6, 9, 11])
        for i in range(len(batch)):
            j = i if i < len(PROMPTS) else len(batch) - 1 - i
            assert torch.equal(results[f"r{i}"].codes, expected[j]), (mode, i)
        stats = engine.stats()
        assert stats["peak_running"] > 1
        if mode == "preemption":
            assert stats["num_preemptions"] > 0
        else:
            assert stats["prefix_cache_hits"] > 0  # each prompt sent twice


def test_seeded_sampling_gives_the_same_codes_alone_and_batched() -> None:
    """Sampled (temperature 1, top-k 50, top-p 0.95: the checkpoint's defaults) with a seed: a request's
    frames are the same alone and among 8 requests arriving at different steps; another seed gives others."""
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_tokens=MAX_NEW)

    def sampled(engine, prompts, seeds):
        reqs = requests(engine, prompts)
        for req, seed in zip(reqs, seeds, strict=True):
            req.params = msgspec.structs.replace(params, seed=seed)
            req.inputs.extension = speech_state(engine.input_resources().higgs_config, req.prompt, req.params)
            assert isinstance(req.inputs.extension, HiggsSpeech) and req.inputs.extension.spec
        return reqs

    engine = talker()
    alone, _ = run(engine, sampled(engine, PROMPTS[2:3], [7]))
    batch = [PROMPTS[2], *PROMPTS, *PROMPTS[:3]]
    engine = talker()
    mixed, _ = run(engine, sampled(engine, batch, [7, 1, 2, 3, 4, 5, 6, 8]), [3, 0, 0, 1, 4, 6, 9, 11])
    assert torch.equal(mixed["r0"].codes, alone["r0"].codes)
    assert not torch.equal(mixed["r3"].codes, alone["r0"].codes)  # the same prompt, seed 3
    assert not torch.equal(reference_codes(*PROMPTS[2]), alone["r0"].codes)
