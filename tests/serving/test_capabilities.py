"""A model family defined only here — its PipelineSpec and its Capabilities — is served on the routes it
declares, with its voices and limits, by the unchanged server (nothing under omnistage/serving or
omnistage/runtime knows it). Its stages are the runtime's toy engines: a toy LM reads a speech prompt, a
mapper turns its tokens into codes and the generation engine's toy vocoder speaks them."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from fastapi.testclient import TestClient

from omnistage.api import AsyncOmni
from omnistage.config.capabilities import Capabilities, Limits
from omnistage.config.pipeline import PipelineSpec, StageSpec
from omnistage.prompts import SpeechPrompt
from omnistage.serving.app import create_app
from omnistage.serving.settings import ServerSettings
from omnistage.stages.base import StageInputContext, StageRequest
from tests.support.toy_pipelines import make_chat
from tests.support.toy_stages import GEN, make_map, make_vocoder, tokens_chunk, tokens_to_map_request

pytestmark = pytest.mark.e2e
VOICES = ("alice", "ethan")  # their last bytes lead the toy LM to different tokens


def speech_prompt_input(ctx: StageInputContext) -> StageRequest:
    """The family's own prompt shape: a speech prompt (voice + text) or, on completions, plain text."""
    prompt: Any = ctx.prompt
    if isinstance(prompt, SpeechPrompt):
        prompt = f"{prompt.input} in {prompt.speaker or VOICES[0]}"  # the toy LM reads the last byte
    return StageRequest(ctx.request_id, prompt=prompt, params=ctx.params)


TOY_TTS = PipelineSpec(
    name="toy-tts",
    stages=(
        StageSpec(0, "reader", "ar", engine=make_chat, input_processor=speech_prompt_input),
        StageSpec(
            1,
            "coder",
            "ar",
            inputs=(0,),
            engine=make_map,
            input_processor=tokens_to_map_request,
            chunk_processor=tokens_chunk,
        ),
        StageSpec(
            2,
            "voice",
            "generation",
            inputs=(1,),
            final_output=True,
            output_modality="audio",
            input_processor=f"{GEN}:tokens_input_processor",
            chunk_processor=f"{GEN}:tokens_chunk_processor",
            engine_args={"generator": make_vocoder, "chunk_size": 2, "left_context": 1, "right_context": 1},
        ),
    ),
    capabilities=Capabilities(
        routes=("speech",),
        prompt="speech",
        fields={"sampling": (0,), "generation": (2,)},
        limits=Limits(max_output_tokens=6),
        voices=VOICES,
    ),
)


@pytest.fixture(scope="module")
def client():
    omni = AsyncOmni(TOY_TTS, placement="inline")
    try:
        with TestClient(create_app({"toy-tts": omni}, ServerSettings())) as client:
            yield client
    finally:
        omni._close()


def speak(client: TestClient, **fields: Any):
    return client.post("/v1/audio/speech", json={"model": "toy-tts", "input": "hello there", **fields})


def samples(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    audio, rate = sf.read(io.BytesIO(response.content), dtype="float32")
    assert rate == 16000 and audio.size > 0
    return audio


def test_the_family_speaks_in_its_voices(client):
    alice = samples(speak(client, voice="alice"))
    again = samples(speak(client, voice="alice"))
    ethan = samples(speak(client, voice="ethan"))
    np.testing.assert_array_equal(alice, again)  # the toy stages are deterministic
    assert not np.array_equal(alice, ethan)  # the voice reached the entry stage


def test_its_voices_and_limits_are_checked_before_any_work(client):
    error = speak(client, voice="carol").json()["error"]
    assert error["param"] == "voice" and "alice" in error["message"]
    response = speak(client, voice="ethan", max_new_tokens=7)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "max_new_tokens" and "max_output_tokens of 6" in error["message"]
    # Without max_new_tokens the reader runs to its limit: the 6 tokens the family allows.
    assert (
        samples(speak(client, voice="ethan")).size
        == samples(speak(client, voice="ethan", max_new_tokens=6)).size
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": "hi"}),
        ("/v1/images/generations", {"prompt": "a cat"}),
    ],
)
def test_routes_it_does_not_declare_are_400(client, path, body):
    response = client.post(path, json={**body, "model": "toy-tts"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "model"
    assert "does not serve" in error["message"] or "cannot serve" in error["message"]


def test_the_model_list_shows_what_it_serves(client):
    (entry,) = client.get("/v1/models").json()["data"]
    assert entry["id"] == "toy-tts" and entry["routes"] == ["speech"] and entry["modalities"] == ["audio"]
