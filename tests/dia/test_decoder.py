"""Dia's decoder on the AR engine, every channel of a frame picked in the post-sample hook: greedy frames
(every channel, the delay pattern's BOS / EOS / padding included) equal the reference's `generate` for each
prompt, with its classifier-free guidance (each request's decoder beside its unconditional twin) and without,
alone and 8 batched arriving at different steps, with the prefix cache on and under forced preemption;
seeded sampling gives a request the same frames alone and batched."""

from __future__ import annotations

import pytest
import torch

from omnistage.families.dia.decoder import DiaFrames, decoder_prompt
from omnistage.families.dia.tiny import tiny_dia_dir
from omnistage.params import SamplingParams
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run
from tests.dia.reference import GUIDED_TOP_K, MAX_NEW, PROMPTS, clip, reference_codes, reference_inputs

pytestmark = pytest.mark.engine

DECODER = {
    "model_loader": "omnistage.families.dia.decoder:load_decoder",
    "post_sample_hook": "omnistage.families.dia.decoder:dia_frame",
}
# 2 layers x 2 KV heads x 16 dims x (K, V) x 4 bytes a token, 8-token blocks: 24 usable blocks for 8 guided
# requests of up to 41 frames (12 blocks a request and its twin)
SMALL_KV = 25 * 8 * 2 * 2 * 2 * 16 * 4
GREEDY = SamplingParams(temperature=0.0, top_k=GUIDED_TOP_K, max_tokens=MAX_NEW)


def decoder(**deploy):
    return make_engine(model_dir=str(tiny_dia_dir()), engine_args={**DECODER, "block_size": 8}, **deploy)


def requests(engine, prompts, params: SamplingParams = GREEDY, scales=None) -> list[StageRequest]:
    """`scales`: each request's guidance scale (None: the checkpoint's)."""
    loaded = engine.input_resources()
    out = []
    for i, text in enumerate(prompts):
        scale = scales[i] if scales is not None else None
        ids, inputs = decoder_prompt(loaded, text, params, guidance_scale=scale)
        out.append(StageRequest(f"r{i}", prompt=ids, params=params, inputs=inputs))
    return out


def codes(result) -> torch.Tensor:
    return torch.cat([torch.as_tensor(c) for c in result.code_chunks]).reshape(-1, 4)


def test_encoder_input_is_the_reference_processors() -> None:
    """The text the encoder reads is the reference processor's input_ids, and the decoder prefix its BOS."""
    engine = decoder()
    loaded = engine.input_resources()
    for text in PROMPTS:
        ids, inputs = decoder_prompt(loaded, text, GREEDY)
        ref = reference_inputs(text)
        assert (
            loaded.text_tokenizer(text, add_special_tokens=False)["input_ids"] == ref["input_ids"][0].tolist()
        )
        assert ids == ref["decoder_input_ids"][0, :1, 0].tolist()
        assert torch.equal(inputs.extension.delay_mask, ref["decoder_input_ids"][0].long())


def test_greedy_codes_equal_reference_alone_and_batched() -> None:
    """With the checkpoint's guidance (3.0; top-k 2) alone and batched; then guided and unguided requests
    (`guidance_scale` 1) mixed in one batch under preemption, each equal to its own reference."""
    expected = [reference_codes(p)[1:] for p in PROMPTS]
    unguided = [reference_codes(p, guidance_scale=1.0)[1:] for p in PROMPTS]
    assert all(not torch.equal(g, u) for g, u in zip(expected, unguided, strict=True))
    ends = [int((e[:, 0] == 64).nonzero()[0]) for e in expected]
    assert ends[3] < MAX_NEW - 5 and ends[:3] == [MAX_NEW - 5] * 3, ends  # one ends on its own
    for i, prompt in enumerate(PROMPTS):
        engine = decoder()
        results, _ = run(engine, requests(engine, [prompt]))
        assert torch.equal(codes(results["r0"]), expected[i]), i
        assert results["r0"].finish_reason == "stop"
    batch = PROMPTS + PROMPTS[::-1]
    mixed = [None, 1.0, 1.0, None, None, 1.0, None, 1.0]
    for mode, deploy, scales in [
        ("prefix_cache", {}, None),
        ("preemption", {"kv_cache_bytes": SMALL_KV}, None),
        ("mixed", {"kv_cache_bytes": SMALL_KV}, mixed),
    ]:
        engine = decoder(**deploy)
        results, _ = run(engine, requests(engine, batch, scales=scales), [0, 0, 1, 3, 4, 6, 9, 11])
        for i in range(len(batch)):
            j = i if i < len(PROMPTS) else len(batch) - 1 - i
            want = unguided[j] if scales and scales[i] == 1.0 else expected[j]
            assert torch.equal(codes(results[f"r{i}"]), want), (mode, i)
        stats = engine.stats()
        assert stats["peak_running"] > 1
        if mode == "prefix_cache":
            assert stats["prefix_cache_hits"] == 0  # cross-attending: self-attention KV is never shared
        else:
            assert stats["num_preemptions"] > 0
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]  # twins' blocks are back too


def test_a_guided_request_needs_room_for_its_twin() -> None:
    """A request and its unconditional twin run together: a stage that runs one sequence at a time refuses
    a guided request (400 naming guidance) rather than never scheduling it, and still serves one without."""
    engine = decoder(max_num_seqs=1)
    results, deltas = run(engine, requests(engine, PROMPTS[:2], scales=[None, 1.0]))
    (refused,) = deltas["r0"]
    assert refused.finish_reason == "error" and refused.error_param == "guidance", refused
    assert torch.equal(codes(results["r1"]), reference_codes(PROMPTS[1], guidance_scale=1.0)[1:])
    with pytest.raises(ValueError, match="guidance_scale"):
        decoder_prompt(engine.input_resources(), PROMPTS[0], GREEDY, guidance_scale=0.5)


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
    params = GREEDY
    codes_in = loaded.clip_codes(audio)
    ids, inputs = decoder_prompt(loaded, text, params, codes_in)
    assert torch.equal(inputs.extension.delay_mask, ref["decoder_input_ids"][0].long())
    prefix = inputs.extension.prefix_len
    assert prefix == codes_in.shape[0] + 1 and len(ids) == prefix
    reqs = requests(engine, PROMPTS[:2]) + [StageRequest("r2", prompt=ids, params=params, inputs=inputs)]
    results, _ = run(engine, reqs, [0, 1, 2])
    assert torch.equal(codes(results["r2"]), want[prefix:])
    assert torch.equal(codes(results["r0"]), reference_codes(PROMPTS[0])[1:])
