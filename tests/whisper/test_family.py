"""Whisper on omnistage's engines: greedy tokens equal transformers' `generate`, on a tiny random Whisper
(solo, and 8 requests arriving at different steps) and on the converted tiny.en (hibari speech); the demo's
transcription of hibari speech has a low word error rate; long audio is cut into segments at pauses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import Omni, SamplingParams
from omnistage.config.deploy import StageDeploy
from omnistage.demo.whisper import whisper_dir
from omnistage.families.whisper.encoder import WhisperEncoderGenerator, as_segments
from omnistage.families.whisper.pipeline import WHISPER_EN, transcription_prompt
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.engine import AREngine
from omnistage.stages.base import EngineContext, StageRequest
from tests.support.asr import word_errors
from tests.whisper.helpers import RATE, SENTENCES, Reference, clip, random_whisper_dir

pytestmark = pytest.mark.engine
INLINE = "omnistage/families/whisper/whisper_inline.yaml"
MAX_NEW = 12


@pytest.fixture(scope="module")
def random_dir():
    return random_whisper_dir()


@pytest.fixture(scope="module")
def tiny_en():
    omni = Omni(whisper_dir(), INLINE)
    yield omni
    omni._close()


def _decoder_engine(model_dir) -> AREngine:
    stage = WHISPER_EN.stage(1)
    deploy = StageDeploy(
        stage_id=1,
        dtype="float32",
        max_num_seqs=8,
        max_num_batched_tokens=64,
        engine_args=dict(stage.engine_args),
    )
    return AREngine(EngineContext(stage=stage, deploy=deploy, model_dir=str(model_dir)))


def _run_staggered(engine: AREngine, requests: list[StageRequest], every: int) -> dict[str, list[int]]:
    """Add request i at step i * every; drive the engine until all finish."""
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    done, step, pending = set(), 0, list(requests)
    while pending or engine.has_work():
        if pending and step % every == 0:
            engine.add_request(pending.pop(0))
        for out in engine.step():
            assert out.error is None, out.error
            tokens[out.request_id] += out.token_ids
            done |= {out.request_id} if out.finished else set()
        step += 1
        assert step < 10_000
    assert done == set(tokens)
    return tokens


def test_random_whisper_greedy_equals_transformers_solo_and_staggered(random_dir):
    rng = np.random.default_rng(0)
    audios = [
        clip(i % 3) if i < 3 else rng.normal(0, 0.1, RATE * (1 + i)).astype(np.float32) for i in range(8)
    ]
    reference = Reference(random_dir)
    expected = reference.tokens(audios, MAX_NEW)
    assert len({tuple(e) for e in expected}) > 1  # the audio decides the tokens
    encoder = WhisperEncoderGenerator(str(random_dir), torch.float32, "cpu")
    states = encoder.generate([as_segments([a]) for a in audios], [None] * 8)
    engine = _decoder_engine(random_dir)
    prompt = [50257, 50362]  # tiny.en's forced prompt: start of transcript, no timestamps
    eos = engine.model.eos_token_ids

    def request(i: int) -> StageRequest:
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW)
        return StageRequest(
            f"r{i}", prompt=prompt, params=params, inputs=ARInputs(encoder_hidden_states=states[i])
        )

    solo = _run_staggered(engine, [request(0)], 1)
    assert [t for t in solo["r0"] if t not in eos] == expected[0]
    got = _run_staggered(engine, [request(i) for i in range(8)], every=2)
    for i in range(8):
        assert [t for t in got[f"r{i}"] if t not in eos] == expected[i], i
    assert engine.peak_running >= 4  # they really ran side by side
    assert engine.stats()["num_requests"] == 0


@pytest.fixture(scope="module")
def tiny_en_outputs(tiny_en):
    prompts = [transcription_prompt(clip(i)) for i in range(len(SENTENCES))]
    return tiny_en.generate(prompts, SamplingParams(temperature=0.0), use_tqdm=False)


def test_tiny_en_tokens_equal_transformers_on_hibari_speech(tiny_en_outputs):
    reference = Reference(whisper_dir())
    expected = reference.tokens([clip(i) for i in range(5)])
    eos = reference.model.generation_config.eos_token_id
    for i in range(5):
        assert tiny_en_outputs[i].error is None
        assert [t for t in tiny_en_outputs[i].token_ids if t != eos] == expected[i], i


def test_previous_text_prompt_decodes_as_transformers_prompt_ids(tiny_en):
    from transformers import WhisperTokenizerFast

    text = "Platform two, trains and stations."
    reference = Reference(whisper_dir())
    prompt_ids = WhisperTokenizerFast.from_pretrained(whisper_dir()).get_prompt_ids(text, return_tensors="pt")
    feats = reference.features(clip(6), sampling_rate=RATE, return_tensors="pt", device="cpu").input_features
    with torch.inference_mode():
        expected = reference.model.generate(feats, prompt_ids=prompt_ids)[0].tolist()
    (out,) = tiny_en.generate(
        [transcription_prompt(clip(6), prompt=text)], SamplingParams(temperature=0.0), use_tqdm=False
    )
    assert out.prompt_token_ids[: len(prompt_ids)] == prompt_ids.tolist()
    assert [t for t in out.token_ids if t != reference.model.generation_config.eos_token_id] == expected


def test_demo_transcribes_hibari_speech_with_low_word_error_rate(tiny_en_outputs):
    """Normaliser: lower case, words of letters and apostrophes (tests/support/asr.py `words`)."""
    errors = [word_errors(ref, out.text) for ref, out in zip(SENTENCES, tiny_en_outputs, strict=True)]
    wer = sum(e for e, _ in errors) / sum(n for _, n in errors)
    assert wer <= 0.2, [o.text for o in tiny_en_outputs]


def test_long_audio_is_cut_at_pauses_into_segments_each_transcribed(tiny_en):
    silence = np.zeros(int(RATE * 2.5), dtype=np.float32)
    parts = []
    for i in range(6):  # 6 x ~3.5 s of speech with 2.5 s pauses: over 30 s
        parts += [clip(i), silence]
    audio = np.concatenate(parts)
    assert len(audio) > 30 * RATE
    (out,) = tiny_en.generate([transcription_prompt(audio)], SamplingParams(temperature=0.0), use_tqdm=False)
    assert out.error is None
    bounds = out.data["segments"]
    choices = out.outputs["choices"]
    assert len(bounds) == len(choices) >= 2
    assert all(end - start <= 30.0 for start, end in bounds)
    assert all(a[1] <= b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    text = " ".join(c["text"] for c in choices)
    errors, total = word_errors(" ".join(SENTENCES[:6]), text)
    assert errors / total <= 0.2, text
