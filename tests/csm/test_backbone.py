"""CSM's backbone on the AR engine, its depth decoder in the post-sample hook: greedy frames (every codebook)
equal the reference's `generate` for each prompt (with and without earlier turns' audio as context), alone
and 8 batched arriving at different steps, under the prefix cache and under forced preemption; seeded
sampling gives a request the same frames alone and batched."""

from __future__ import annotations

import msgspec
import pytest
import torch

from omnistage.families.csm.backbone import DepthSampling, depth_sampling
from omnistage.families.csm.pipeline import backbone_prompt
from omnistage.families.csm.tiny import tiny_csm_dir
from omnistage.params import SamplingParams
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run
from tests.csm.reference import MAX_NEW, PROMPTS, reference_codes, reference_inputs, wav

pytestmark = pytest.mark.engine

BACKBONE = {
    "model_loader": "omnistage.families.csm.backbone:load_backbone",
    "post_sample_hook": "omnistage.families.csm.backbone:depth_codes",
}
# 2 layers x 2 KV heads x 16 dims x (K, V) x 4 bytes a token, 8-token blocks: 24 usable blocks for 8 requests
# of up to ~100 tokens
SMALL_KV = 25 * 8 * 2 * 2 * 2 * 16 * 4


def backbone(**deploy):
    return make_engine(model_dir=str(tiny_csm_dir()), engine_args={**BACKBONE, "block_size": 8}, **deploy)


def turns_of(prompt) -> list[dict]:
    return [{"speaker": s, "text": t, "clip": {"data": wav(a)}} for s, t, a in prompt[2]]


def requests(engine, prompts, params: SamplingParams | None = None) -> list[StageRequest]:
    loaded = engine.input_resources()
    out = []
    for i, prompt in enumerate(prompts):
        ids, inputs = backbone_prompt(loaded, prompt[0], prompt[1], turns_of(prompt))
        params_i = params or SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
        inputs = inputs or ARInputs()
        inputs.extension = depth_sampling(loaded, params_i)
        out.append(StageRequest(f"r{i}", prompt=ids, params=params_i, inputs=inputs))
    return out


def test_prompt_is_the_reference_processors() -> None:
    """Token for token what the reference's processor makes of the same conversation (audio positions
    included), and the clips' frames are what its Mimi encodes."""
    engine = backbone()
    loaded = engine.input_resources()
    for prompt in PROMPTS:
        ids, _ = backbone_prompt(loaded, prompt[0], prompt[1], turns_of(prompt))
        assert ids == reference_inputs(*prompt)["input_ids"][0].tolist()


def test_greedy_codes_equal_reference_alone_and_batched() -> None:
    expected = [reference_codes(*p) for p in PROMPTS]
    assert all(e.shape == (MAX_NEW, 8) for e in expected)
    for i, prompt in enumerate(PROMPTS):
        engine = backbone()
        results, _ = run(engine, requests(engine, [prompt]))
        assert torch.equal(results["r0"].codes, expected[i]), i
    batch = PROMPTS + PROMPTS[::-1]
    for mode, deploy in [("prefix_cache", {}), ("preemption", {"kv_cache_bytes": SMALL_KV})]:
        engine = backbone(**deploy)
        results, _ = run(engine, requests(engine, batch), [0, 0, 1, 3, 4, 6, 9, 11])
        for i in range(len(batch)):
            j = i if i < len(PROMPTS) else len(batch) - 1 - i
            assert torch.equal(results[f"r{i}"].codes, expected[j]), (mode, i)
        stats = engine.stats()
        assert stats["peak_running"] > 1
        if mode == "preemption":
            assert stats["num_preemptions"] > 0
        else:
            assert stats["prefix_cache_hits"] > 0  # the text-only prompts, each sent twice


def test_seeded_sampling_gives_the_same_codes_alone_and_batched() -> None:
    """Sampled as the checkpoint says (temperature 0.9, top-k 50, the depth decoder too) with a seed: a
    request's frames are the same alone and among 8 requests arriving at different steps, and another seed
    gives other frames."""

    def sampled(engine, prompts, seeds):
        reqs = requests(engine, prompts)
        for req, seed in zip(reqs, seeds, strict=True):
            req.params = msgspec.structs.replace(req.params, temperature=0.9, top_k=50, seed=seed)
            req.inputs.extension = depth_sampling(engine.input_resources(), req.params)
            assert isinstance(req.inputs.extension, DepthSampling) and req.inputs.extension.spec
        return reqs

    engine = backbone()
    alone, _ = run(engine, sampled(engine, PROMPTS[2:3], [7]))
    batch = [PROMPTS[2], *PROMPTS, *PROMPTS[:3]]
    engine = backbone()
    mixed, _ = run(engine, sampled(engine, batch, [7, 1, 2, 3, 4, 5, 6, 8]), [3, 0, 0, 1, 4, 6, 9, 11])
    assert torch.equal(mixed["r0"].codes, alone["r0"].codes)
    assert not torch.equal(mixed["r3"].codes, alone["r0"].codes)  # the same prompt, seed 3
    greedy = reference_codes(*PROMPTS[2])
    assert not torch.equal(greedy, alone["r0"].codes)
