"""The hibari voice on the generation engine, with the library's own synthesis and with the fast one
(synthesis.py): batched or not, streamed or not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.config.deploy import StageDeploy
from omnistage.families.hibari.pipeline import HIBARI_TTS, SPOKEN_CHAT
from omnistage.families.hibari.synthesis import fast_noise, synthesize
from omnistage.families.hibari.units import speech_units
from omnistage.families.hibari.voice import HibariVoice, load_hibari
from omnistage.outputs import StageOutput, StageResult
from omnistage.params import GenerationParams
from omnistage.stages.base import EngineContext, StageInputContext, StageRequest
from tests.support.asr import transcribe, word_errors

pytestmark = pytest.mark.engine

TEXTS = [
    "The weather is nice today. Please open the door for me.",
    "Good morning, my dear friend, how have you been? I would like a cup of coffee.",
    "Turn left at the next corner; the station is on your right.",
]


@pytest.fixture(scope="module", params=["library", "fast"])
def engine(request):
    from omnistage.families.hibari.voice import create_engine

    stage = HIBARI_TTS.stage(0)
    deploy = StageDeploy(stage_id=0, engine_args={"synthesis": request.param})
    return create_engine(EngineContext(stage=stage, deploy=deploy, model_dir=None))


def run(engine, requests: list[StageRequest]) -> dict[str, torch.Tensor]:
    for request in requests:
        engine.add_request(request)
    audio: dict[str, list[torch.Tensor]] = {r.request_id: [] for r in requests}
    finished = set()
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            audio[out.request_id].append(out.audio)
            finished |= {out.request_id} if out.finished else set()
    assert finished == set(audio) and engine.stats()["num_requests"] == 0
    return {rid: torch.cat(parts) for rid, parts in audio.items()}


def speech_request(engine, rid: str, text: str, seed: int, speed: float = 1.0) -> StageRequest:
    ctx = StageInputContext(
        rid,
        {"input": text, "speed": speed},
        GenerationParams(seed=seed),
        {},
        HIBARI_TTS.stage(0),
        engine.input_resources(),
    )
    return HIBARI_TTS.stage(0).input_processor(ctx)


def reference_audio(synthesis: str, text: str, seed: int, speed: float = 1.0) -> torch.Tensor:
    """Unit by unit, each with the noise the voice stage gives that unit: hibari itself (`library`), or
    hibari's network with the fast synthesis (`fast`)."""
    tts = load_hibari()
    voice = HibariVoice(tts)
    units, _ = speech_units(text, final=True, first=True)
    pieces = []
    for index, ps in enumerate(p for unit in units for p in tts.phonemize(unit)):
        if synthesis == "library":
            pieces.append(tts.from_ids(tts.ids(ps), speed, np.random.default_rng([seed, index])))
        else:
            outputs = voice.spectra(tts.ids(ps), speed)
            shape = (outputs[0].shape[0], 2 * outputs[0].shape[1])
            pieces.append(synthesize(outputs, fast_noise(seed, index, shape)))
    return torch.from_numpy(np.concatenate(pieces).astype(np.float32))


def test_the_fast_synthesis_equals_the_library_given_the_same_noise() -> None:
    tts = load_hibari()
    voice = HibariVoice(tts)
    worst = 0.0
    for seed, text in enumerate(TEXTS):
        for index, ps in enumerate(tts.phonemize(text)):
            for speed in (0.8, 1.0, 1.6):
                expected = tts.from_ids(tts.ids(ps), speed, np.random.default_rng([seed, index]))
                outputs = voice.spectra(tts.ids(ps), speed)
                shape = (outputs[0].shape[0], 2 * outputs[0].shape[1])
                # what `hibari.dsp.synth` draws from the generator the voice stage gives it
                noise = np.random.default_rng([seed, index]).standard_normal(shape, dtype=np.float32)
                made = synthesize(outputs, noise)
                assert made.dtype == np.float32 and made.shape == expected.shape
                worst = max(worst, float(np.abs(made - expected).max()))
    assert worst <= 1e-6, worst  # float32 FFTs in another order; one int16 step is 3e-5


def test_the_fast_noise_is_fixed_by_seed_and_sentence() -> None:
    a, again = fast_noise(3, 1, (601, 400)), fast_noise(3, 1, (601, 400))
    assert np.array_equal(a, again)
    assert not np.array_equal(a, fast_noise(3, 2, (601, 400)))
    assert not np.array_equal(a, fast_noise(4, 1, (601, 400)))
    assert a.dtype == np.float32 and abs(float(a.mean())) < 0.01 and abs(float(a.std()) - 1) < 0.01


def test_batched_speech_equals_the_voice_sentence_by_sentence(engine) -> None:
    solo = {
        f"s{i}": run(engine, [speech_request(engine, f"s{i}", t, seed=i)])[f"s{i}"]
        for i, t in enumerate(TEXTS)
    }
    batched = run(engine, [speech_request(engine, f"s{i}", t, seed=i) for i, t in enumerate(TEXTS)])
    for i, text in enumerate(TEXTS):
        expected = reference_audio(engine.generator.synthesis, text, seed=i)
        assert torch.equal(solo[f"s{i}"], expected)
        assert torch.equal(batched[f"s{i}"], expected)
    slow = run(engine, [speech_request(engine, "slow", TEXTS[0], seed=0, speed=0.8)])["slow"]
    assert torch.equal(slow, reference_audio(engine.generator.synthesis, TEXTS[0], seed=0, speed=0.8))
    assert slow.numel() > solo["s0"].numel()  # slower speech is longer


def test_the_voice_is_intelligible(engine) -> None:
    errors = total = 0
    for i, text in enumerate(TEXTS):
        heard = transcribe(run(engine, [speech_request(engine, "a", text, seed=i)])["a"].numpy(), 24000)
        e, n = word_errors(text, heard)
        errors, total = errors + e, total + n
    assert errors / total <= 0.3, (errors, total)


@pytest.mark.parametrize("text", [*TEXTS, "Paris, the City of Love, is old. It is big!", "Yes.", "no end"])
def test_units_are_the_same_whole_or_streamed(text: str) -> None:
    whole, _ = speech_units(text, final=True, first=True)
    for step in (1, 3, 7):
        units, buffer, first = [], "", True
        for i in range(0, len(text), step):
            made, buffer = speech_units(buffer + text[i : i + step], final=False, first=first)
            units, first = units + made, first and not made
        made, _ = speech_units(buffer, final=True, first=first)
        assert units + made == whole


def test_a_spoken_reply_streamed_in_equals_the_finished_reply(engine) -> None:
    """The voice of a spoken chat: the LLM's text arriving token by token (async chunk) is spoken exactly as
    the finished answer is (full handoff)."""
    stage = SPOKEN_CHAT.stage(1)
    text = TEXTS[1] + " " + TEXTS[2]
    resources = engine.input_resources()
    params = GenerationParams(seed=7)
    done = StageResult(stage_id=0, text=text, finished=True)
    full_ctx = StageInputContext("full", None, params, {0: done}, stage, resources)
    full = run(engine, [stage.input_processor(full_ctx)])["full"]

    ctx = StageInputContext("streamed", None, params, {0: StageResult(stage_id=0)}, stage, resources)
    pieces = [text[i : i + 4] for i in range(0, len(text), 4)]
    audio, started = [], False
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        made = stage.chunk_processor(ctx, StageOutput("streamed", text=piece), last)
        if isinstance(made, StageRequest):
            made.streaming_input = not last
            engine.add_request(made)
            started = True
        elif made is not None:
            engine.add_chunk("streamed", made, last)
        while started and engine.has_work():
            audio += [out.audio for out in engine.step()]
    assert torch.equal(torch.cat(audio), full)
    assert torch.equal(full, reference_audio(engine.generator.synthesis, text, seed=7))


def test_an_unknown_synthesis_is_refused_by_name() -> None:
    from omnistage.errors import ConfigError

    with pytest.raises(ConfigError, match=r"synthesis: must be one of fast, library, got 'quick'"):
        HibariVoice(load_hibari(), "quick")
