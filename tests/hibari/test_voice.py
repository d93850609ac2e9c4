"""The hibari voice on the generation engine: the library's own synthesis, batched or not, streamed or not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage.config.deploy import StageDeploy
from omnistage.models.hibari.units import speech_units
from omnistage.models.hibari.voice import load_hibari
from omnistage.outputs import StageOutput, StageResult
from omnistage.params import GenerationParams
from omnistage.pipelines.hibari import HIBARI_TTS, SPOKEN_CHAT
from omnistage.stages.base import EngineContext, StageInputContext, StageRequest
from tests.asr import transcribe, word_errors

pytestmark = pytest.mark.engine

TEXTS = [
    "The weather is nice today. Please open the door for me.",
    "Good morning, my dear friend, how have you been? I would like a cup of coffee.",
    "Turn left at the next corner; the station is on your right.",
]


@pytest.fixture(scope="module")
def engine():
    from omnistage.models.hibari.voice import create_engine

    stage = HIBARI_TTS.stage(0)
    return create_engine(EngineContext(stage=stage, deploy=StageDeploy(stage_id=0), model_dir=None))


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


def library_audio(text: str, seed: int, speed: float = 1.0) -> torch.Tensor:
    """hibari itself, unit by unit, each with the generator the voice stage gives that unit."""
    tts = load_hibari()
    units, _ = speech_units(text, final=True, first=True)
    pieces = []
    for index, ps in enumerate(p for unit in units for p in tts.phonemize(unit)):
        pieces.append(tts.from_ids(tts.ids(ps), speed, np.random.default_rng([seed, index])))
    return torch.from_numpy(np.concatenate(pieces).astype(np.float32))


def test_batched_speech_equals_the_library_sentence_by_sentence(engine) -> None:
    solo = {
        f"s{i}": run(engine, [speech_request(engine, f"s{i}", t, seed=i)])[f"s{i}"]
        for i, t in enumerate(TEXTS)
    }
    batched = run(engine, [speech_request(engine, f"s{i}", t, seed=i) for i, t in enumerate(TEXTS)])
    for i, text in enumerate(TEXTS):
        expected = library_audio(text, seed=i)
        assert torch.equal(solo[f"s{i}"], expected)
        assert torch.equal(batched[f"s{i}"], expected)
    slow = run(engine, [speech_request(engine, "slow", TEXTS[0], seed=0, speed=0.8)])["slow"]
    assert torch.equal(slow, library_audio(TEXTS[0], seed=0, speed=0.8))
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
    full_ctx = StageInputContext("full", {}, params, {0: done}, stage, resources)
    full = run(engine, [stage.input_processor(full_ctx)])["full"]

    ctx = StageInputContext("streamed", {}, params, {0: StageResult(stage_id=0)}, stage, resources)
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
    assert torch.equal(full, library_audio(text, seed=7))
