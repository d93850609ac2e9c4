"""Dia's decoder on the AR engine, every channel of a frame picked in the post-sample hook: greedy frames
(every channel, the delay pattern's BOS / EOS / padding included) equal the reference's
`generate(guidance_scale=1)` for each prompt, alone and 8 batched arriving at different steps, with the
prefix cache on and under forced preemption; seeded sampling gives a request the same frames alone and
batched."""

from __future__ import annotations

import pytest
import torch

from omnistage.families.dia.decoder import DiaFrames, decoder_prompt
from omnistage.families.dia.tiny import tiny_dia_dir
from omnistage.params import SamplingParams
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run
from tests.dia.reference import MAX_NEW, PROMPTS, clip, reference_codes, reference_inputs

pytestmark = pytest.mark.engine

DECODER = {
    "model_loader": "omnistage.families.dia.decoder:load_decoder",
    "post_sample_hook": "omnistage.families.dia.decoder:dia_frame",
}
# 2 layers x 2 KV heads x 16 dims x (K, V) x 4 bytes a token, 8-token blocks: 12 usable blocks for 8 requests
# of up to 41 frames (6 blocks)
SMALL_KV = 13 * 8 * 2 * 2 * 2 * 16 * 4


def decoder(**deploy):
    return make_engine(model_dir=str(tiny_dia_dir()), engine_args={**DECODER, "block_size": 8}, **deploy)


def requests(engine, prompts, params: SamplingParams | None = None) -> list[StageRequest]:
    loaded = engine.input_resources()
    out = []
    for i, text in enumerate(prompts):
        params_i = params or SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
        ids, inputs = decoder_prompt(loaded, text, params_i)
        out.append(StageRequest(f"r{i}", prompt=ids, params=params_i, inputs=inputs))
    return out


def codes(result) -> torch.Tensor:
    return torch.cat([torch.as_tensor(c) for c in result.code_chunks]).reshape(-1, 4)


def test_encoder_input_is_the_reference_processors() -> None:
    """The text the encoder reads is the reference processor's input_ids, and the decoder prefix its BOS."""
    engine = decoder()
    loaded = engine.input_resources()
    for text in PROMPTS:
        ids, inputs = decoder_prompt(loaded, text, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
        ref = reference_inputs(text)
        assert (
            loaded.text_tokenizer(text, add_special_tokens=False)["input_ids"] == ref["input_ids"][0].tolist()
        )
        assert ids == ref["decoder_input_ids"][0, :1, 0].tolist()
        assert torch.equal(inputs.extension.delay_mask, ref["decoder_input_ids"][0].long())


def test_greedy_codes_equal_reference_alone_and_batched() -> None:
    expected = [reference_codes(p)[1:] for p in PROMPTS]
    ends = [int((e[:, 0] == 64).nonzero()[0]) for e in expected]
    assert ends[1] == MAX_NEW - 5 and all(end < MAX_NEW - 5 for end in ends[:1] + ends[2:]), ends
    for i, prompt in enumerate(PROMPTS):
        engine = decoder()
        results, _ = run(engine, requests(engine, [prompt]))
        assert torch.equal(codes(results["r0"]), expected[i]), i
        assert results["r0"].finish_reason == "stop"
    batch = PROMPTS + PROMPTS[::-1]
    for mode, deploy in [("prefix_cache", {}), ("preemption", {"kv_cache_bytes": SMALL_KV})]:
        engine = decoder(**deploy)
        results, _ = run(engine, requests(engine, batch), [0, 0, 1, 3, 4, 6, 9, 11])
        for i in range(len(batch)):
            j = i if i < len(PROMPTS) else len(batch) - 1 - i
            assert torch.equal(codes(results[f"r{i}"]), expected[j]), (mode, i)
        stats = engine.stats()
        assert stats["peak_running"] > 1
        if mode == "preemption":
            assert stats["num_preemptions"] > 0
        else:
            assert stats["prefix_cache_hits"] == 0  # cross-attending: self-attention KV is never shared


def test_seeded_sampling_gives_the_same_codes_alone_and_batched() -> None:
    """Sampled as the checkpoint says (temperature 1.8, top-k 45, top-p 0.9) with a seed: a request's frames
    are the same alone and among 8 requests arriving at different steps, and another seed gives others."""

    def sampled(engine, prompts, seeds):
        out = []
        for i, (text, seed) in enumerate(zip(prompts, seeds, strict=True)):
            params = SamplingParams(temperature=1.8, top_k=45, top_p=0.9, seed=seed, max_tokens=MAX_NEW)
            ids, inputs = decoder_prompt(engine.input_resources(), text, params)
            assert isinstance(inputs.extension, DiaFrames) and inputs.extension.spec
            out.append(StageRequest(f"r{i}", prompt=ids, params=params, inputs=inputs))
        return out

    engine = decoder()
    alone, _ = run(engine, sampled(engine, PROMPTS[2:3], [7]))
    batch = [PROMPTS[2], *PROMPTS, *PROMPTS[:3]]
    engine = decoder()
    mixed, _ = run(engine, sampled(engine, batch, [7, 1, 2, 3, 4, 5, 6, 8]), [3, 0, 0, 1, 4, 6, 9, 11])
    assert torch.equal(codes(mixed["r0"]), codes(alone["r0"]))
    assert not torch.equal(codes(mixed["r3"]), codes(alone["r0"]))  # the same prompt, seed 3
    greedy = reference_codes(PROMPTS[2])[1:]
    assert not torch.equal(greedy, codes(alone["r0"]))


def test_an_audio_prompt_continues_as_the_reference() -> None:
    """An audio prompt (the processor's `audio`: a clip DAC-encodes into the decoder prefix, delayed): the
    prefix is the reference processor's `decoder_input_ids`, and the greedy frames after it its
    `generate`'s, alone and batched with plain prompts."""
    text = "[S1] Once upon a time. [S2] A small model learned to speak."
    audio = clip(0.2, 180.0)
    ref = reference_inputs(text, audio)
    want = reference_codes(text, audio)
    engine = decoder()
    loaded = engine.input_resources()
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
    codes_in = loaded.clip_codes(audio)
    ids, inputs = decoder_prompt(loaded, text, params, codes_in)
    assert torch.equal(inputs.extension.delay_mask, ref["decoder_input_ids"][0].long())
    prefix = inputs.extension.prefix_len
    assert prefix == codes_in.shape[0] + 1 and len(ids) == prefix
    reqs = requests(engine, PROMPTS[:2]) + [StageRequest("r2", prompt=ids, params=params, inputs=inputs)]
    results, _ = run(engine, reqs, [0, 1, 2])
    assert torch.equal(codes(results["r2"]), want[prefix:])
    assert torch.equal(codes(results["r0"]), reference_codes(PROMPTS[0])[1:])
