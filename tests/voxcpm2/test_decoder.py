"""VoxCPM2's LMs on the AR engine, each patch made by the local DiT in the post-sample hook: with the
reference's noise reproduced (tests/voxcpm2/reference.py), the latent patches equal `VoxCPM2Model`'s within
1e-4 for each prompt, alone and 8 batched arriving at different steps, with the prefix cache on and under
forced preemption; a seeded request's patches are the same alone and batched, another seed gives others."""

from __future__ import annotations

import pytest
import torch

from omnistage.families import registry
from omnistage.families.voxcpm2.decoder import VoxPrompt, decoder_prompt
from omnistage.families.voxcpm2.tiny import tiny_voxcpm2_dir
from omnistage.params import SamplingParams
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run
from tests.voxcpm2.reference import MAX_NEW, PROMPTS, SEEDS, reference_latents

pytestmark = pytest.mark.engine

DECODER = {
    "model_loader": "omnistage.families.voxcpm2.decoder:load_voxcpm",
    "post_sample_hook": "omnistage.families.voxcpm2.decoder:voxcpm_patch",
}
# 3 layers (2 base + 1 residual) x 2 KV heads x 16 dims x (K, V) x 4 bytes a token, 8-token blocks: 16 usable
# blocks for 8 requests of up to ~45 positions (6 blocks each)
SMALL_KV = 17 * 8 * 3 * 2 * 2 * 16 * 4
TOLERANCE = 1e-4


def decoder(**deploy):
    registry.load()  # the family's extra input (its audio-position mask)
    return make_engine(model_dir=str(tiny_voxcpm2_dir()), engine_args={**DECODER, "block_size": 8}, **deploy)


def requests(engine, prompts, seeds) -> list[StageRequest]:
    loaded = engine.input_resources()
    out = []
    for i, (text, seed) in enumerate(zip(prompts, seeds, strict=True)):
        limit = min(int(len(loaded.vox.text_tokenizer(text)) * 6 + 10), MAX_NEW)
        params = SamplingParams(temperature=0.0, max_tokens=limit, min_tokens=3, seed=seed, detokenize=False)
        ids, inputs = decoder_prompt(loaded, text, params)
        assert isinstance(inputs.extension, VoxPrompt)
        out.append(StageRequest(f"r{i}", prompt=ids, params=params, inputs=inputs))
    return out


def latents(deltas) -> torch.Tensor:
    return torch.cat([torch.as_tensor(o.tensors["latents"]) for o in deltas if o.tensors])


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= TOLERANCE


def test_latents_equal_reference_alone_and_batched() -> None:
    expected = [reference_latents(p, s) for p, s in zip(PROMPTS, SEEDS, strict=True)]
    lengths = [len(e) for e in expected]
    assert MAX_NEW in lengths and min(lengths) < MAX_NEW, lengths  # some stop on their own, one at the limit
    for i in range(len(PROMPTS)):
        engine = decoder()
        results, deltas = run(engine, requests(engine, PROMPTS[i : i + 1], SEEDS[i : i + 1]))
        assert close(latents(deltas["r0"]), expected[i]), i
        assert results["r0"].finish_reason == ("length" if lengths[i] == MAX_NEW else "stop")
    batch, seeds = PROMPTS + PROMPTS[::-1], SEEDS + SEEDS[::-1]
    for mode, deploy in [("prefix_cache", {}), ("preemption", {"kv_cache_bytes": SMALL_KV})]:
        engine = decoder(**deploy)
        _, deltas = run(engine, requests(engine, batch, seeds), [0, 0, 1, 3, 4, 6, 9, 11])
        for i in range(len(batch)):
            j = i if i < len(PROMPTS) else len(batch) - 1 - i
            assert close(latents(deltas[f"r{i}"]), expected[j]), (mode, i)
        stats = engine.stats()
        assert stats["peak_running"] > 1 and stats["kv_blocks_free"] == stats["kv_blocks_total"]
        if mode == "preemption":
            assert stats["num_preemptions"] > 0


def test_seeded_patches_are_the_same_alone_and_batched() -> None:
    engine = decoder()
    _, alone = run(engine, requests(engine, PROMPTS[2:3], [5]))
    engine = decoder(kv_cache_bytes=SMALL_KV)
    batch = [PROMPTS[2], *PROMPTS, *PROMPTS[:3]]
    _, mixed = run(engine, requests(engine, batch, [5, 1, 2, 3, 4, 6, 11, 12]), [3, 0, 0, 1, 4, 6, 9, 11])
    assert close(latents(mixed["r0"]), latents(alone["r0"]))  # batched GEMMs round apart: within 1e-4
    assert not close(latents(mixed["r3"]), latents(alone["r0"]))  # the same prompt, another seed
    assert engine.stats()["num_preemptions"] > 0
