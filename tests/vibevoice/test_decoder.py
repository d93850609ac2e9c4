"""VibeVoice's LM on the AR engine, each frame made in the post-sample hook (the diffusion head against the
unconditional branch, the acoustic decoder, the semantic encoder): with the reference's noise reproduced
(tests/vibevoice/reference.py), the tokens equal `generate`'s, the latents and the frames' waveform within
1e-4, for 4 prompts and scripts (segments ended and restarted, a frame straight after a segment's end, the
end of speech), alone and 8 batched arriving at different steps under forced preemption; a cloned voice's
clip gives the reference's latents; another seed gives other latents."""

from __future__ import annotations

import pytest
import torch

from omnistage.families.vibevoice.prompt import speech_prompt
from omnistage.families.vibevoice.tiny import tiny_vibevoice_dir
from omnistage.params import SamplingParams
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import make_engine, run
from tests.vibevoice.reference import MAX_NEW, PROCESSORS, PROMPTS, SCRIPTS, SEEDS, clip, reference

pytestmark = pytest.mark.engine

DECODER = {
    "model_loader": "omnistage.families.vibevoice.decoder:load_vibevoice",
    "post_sample_hook": "omnistage.families.vibevoice.decoder:vibevoice_frame",
}
# 2 layers x 2 KV heads x 16 dims x (K, V) x 4 bytes a token, 8-token blocks: 37 blocks, for 8 requests of
# ~155 positions (20 blocks each): two run at once, and grow into each other
SMALL_KV = 38 * 8 * 2 * 2 * 2 * 16 * 4
TOLERANCE = 1e-4
CASES = [(0, "a"), (1, "b"), (2, "c"), (3, "d")]  # (prompt, script)


def decoder(**deploy):
    return make_engine(
        model_dir=str(tiny_vibevoice_dir()), engine_args={**DECODER, "block_size": 8}, **deploy
    )


def request(engine, rid: str, prompt: int, script: str, seed: int, clips=None) -> StageRequest:
    processor = PROCESSORS[script]
    params = SamplingParams(
        temperature=0.0,
        max_tokens=MAX_NEW,
        seed=seed,
        detokenize=False,
        logits_processors=[processor] if processor else [],
    )
    ids, inputs = speech_prompt(engine.input_resources(), PROMPTS[prompt], params, clips)
    return StageRequest(rid, prompt=ids, params=params, inputs=inputs)


def joined(deltas, key: str) -> torch.Tensor:
    rows = [torch.as_tensor(o.tensors[key]) for o in deltas if key in o.tensors]
    return torch.cat(rows).reshape(len(rows), -1) if rows else torch.empty(0)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and float((a - b).abs().max()) <= TOLERANCE


def same_as(deltas, want) -> bool:
    tokens, latents, wave = want
    got = [t for o in deltas for t in o.token_ids]
    return (
        got == tokens
        and close(joined(deltas, "latents"), latents)
        and close(joined(deltas, "audio").reshape(-1), wave)
    )


def test_frames_equal_reference_alone_and_batched_under_preemption() -> None:
    engine = decoder()
    expected = []
    for i, (prompt, script) in enumerate(CASES):
        req = request(engine, f"alone{i}", prompt, script, SEEDS[i])
        want = reference(req.prompt, SEEDS[i], SCRIPTS[script])
        assert len(want[1]) >= 6 and float(want[2].abs().max()) > 0.01, i
        expected.append(want)
        _, deltas = run(engine, [req])
        assert same_as(deltas[f"alone{i}"], want), i
    assert {t for want in expected for t in want[0]} == set(engine.input_resources().ids.values())
    engine = decoder(kv_cache_bytes=SMALL_KV)
    order = CASES + CASES[::-1]
    seeds = SEEDS + SEEDS[::-1]
    batch = [request(engine, f"r{i}", p, s, seeds[i]) for i, (p, s) in enumerate(order)]
    _, deltas = run(engine, batch, [0, 0, 1, 3, 4, 6, 9, 11])
    for i in range(len(batch)):
        j = i if i < len(CASES) else len(batch) - 1 - i
        assert same_as(deltas[f"r{i}"], expected[j]), i
    stats = engine.stats()
    assert stats["peak_running"] > 1 and stats["num_preemptions"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_a_cloned_voice_equals_reference_and_another_seed_differs() -> None:
    from transformers import VibeVoiceAcousticTokenizerFeatureExtractor

    engine = decoder()
    sample = clip(0.05, 180.0)
    req = request(engine, "clone", 0, "c", 5, clips={0: sample})
    token = engine.input_resources().ids["token"]
    assert req.prompt.count(token) == 30  # 0.05 s at 24 kHz, 40 samples a frame
    extractor = VibeVoiceAcousticTokenizerFeatureExtractor.from_pretrained(str(tiny_vibevoice_dir()))
    features = extractor([sample], sampling_rate=24000, return_tensors="pt")
    want = reference(
        req.prompt, 5, "", input_values=features["input_values"], padding_mask=features["padding_mask"]
    )
    _, deltas = run(engine, [req, request(engine, "other", 0, "c", 6, clips={0: sample})])
    assert same_as(deltas["clone"], want)
    unprompted = reference(request(engine, "x", 0, "c", 5).prompt, 5, "")
    assert not close(want[1], unprompted[1])  # the clip changes the voice
    assert not close(joined(deltas["other"], "latents"), want[1])  # another seed: other noise


def test_the_pipeline_speaks_the_reference_waveform() -> None:
    """The checkpoint directory resolves to the family (its architecture), and the offline API in one
    process (full handoff) speaks a two-speaker script as `generate` does, within 1e-4."""
    from omnistage import Omni
    from omnistage.families.resolve import resolve_pipeline
    from omnistage.prompts import SpeechPrompt

    model_dir = str(tiny_vibevoice_dir())
    assert resolve_pipeline(model_dir)[0].name == "vibevoice"
    params = SamplingParams(seed=SEEDS[1], max_tokens=MAX_NEW)
    with Omni(model_dir, "omnistage/families/vibevoice/vibevoice_inline.yaml") as omni:
        out = omni.generate(SpeechPrompt(input=PROMPTS[1]), [params, None], use_tqdm=False)[0]
    assert out.error is None and out.sample_rate == 24000, out.error
    _, _, wave = reference(out.prompt_token_ids, SEEDS[1], "")
    assert len(wave) == MAX_NEW * 40 and close(torch.as_tensor(out.audio).reshape(-1), wave)
