"""Shared Qwen3-Omni fixtures: the tiny checkpoint, its processor, prompts and the reference outputs (the
reference runs once per session; every test compares against the same ground truth)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.config.deploy import resolve_deploy
from omnistage.families.qwen3_omni.checkpoint import qwen3_omni_dir
from omnistage.families.qwen3_omni.pipeline import QWEN3_OMNI
from omnistage.outputs import StageOutput, StageResult
from omnistage.runtime.stage_process import create_engine
from tests.qwen3_omni.reference import load_reference_model, run_reference
from tests.support import stage_chain

THINKER_TOKENS = 10
# The reference feeds back every talker token but the last, so N talker tokens give N - 1 frames;
# omnistage's post-sample hook makes a frame for every token it samples: max_tokens = FRAMES gives the
# reference's first FRAMES frames.
FRAMES = 20  # code2wav's async chunks: the first 4 frames, then 16 more (16 is SamplingParams' default
# max_tokens, which would not override the talker's pipeline default)


def _prompts() -> dict[str, object]:
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(16000) * 0.1).astype(np.float32)
    image = rng.integers(0, 255, (64, 96, 3), dtype=np.uint8)
    video = rng.integers(0, 255, (4, 64, 96, 3), dtype=np.uint8)
    return {
        "text": "Hello there",
        "image": {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": image}, {"type": "text", "text": "What?"}],
                }
            ],
            "speaker": "Aiden",
        },
        "audio": {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "audio", "audio": audio}, {"type": "text", "text": "Why?"}],
                }
            ],
            "speaker": "Chelsie",
        },
        "video": {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "video", "video": video}, {"type": "text", "text": "Go"}],
                }
            ]
        },
    }


PROMPTS = _prompts()


def greedy_params() -> list[object]:
    """Per-stage params matching the reference run: greedy thinker and talker (the
    reference talker's repetition penalty)."""
    return [
        SamplingParams(temperature=0.0, max_tokens=THINKER_TOKENS),
        SamplingParams(temperature=0.0, max_tokens=FRAMES, repetition_penalty=1.05),
        None,
    ]


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Two shared cores: one intra-op thread per process avoids oversubscription stalls."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def omni3_dir():
    return qwen3_omni_dir("tiny")


@pytest.fixture(scope="session")
def references(omni3_dir):
    from transformers import Qwen3OmniMoeProcessor

    from omnistage.families.qwen2_5_omni.processor import load_processor

    model = load_reference_model(omni3_dir)
    processor = load_processor(str(omni3_dir), Qwen3OmniMoeProcessor)
    out = {}
    for name, prompt in PROMPTS.items():
        speaker = prompt.get("speaker", "Ethan") if isinstance(prompt, dict) else "Ethan"
        out[name] = run_reference(
            model,
            processor,
            prompt,
            speaker=speaker,
            thinker_max_new_tokens=THINKER_TOKENS,
            talker_max_new_tokens=FRAMES + 1,
        )
    return out


@pytest.fixture(scope="session")
def engines(omni3_dir):
    """thinker, talker, code2wav (full handoff), code2wav (async chunk, the default deploy's chunking)."""
    made = []
    for stage_id, async_chunk in ((0, None), (1, None), (2, False), (2, True)):
        deploy = resolve_deploy(QWEN3_OMNI, None, None, {str(stage_id): {"async_chunk": async_chunk}})
        made.append(create_engine(QWEN3_OMNI.stage(stage_id), deploy.stage(stage_id), str(omni3_dir), "cpu"))
    return made


def run_stage(stage_id, engine, prompt, params, results, deltas=None) -> StageResult:
    return stage_chain.run_stage(QWEN3_OMNI, stage_id, engine, prompt, params, results, deltas)


def stream_stage(stage_id, engine, prompt, params, chunks: list[StageOutput]) -> tuple[StageResult, int]:
    return stage_chain.stream_stage(QWEN3_OMNI, stage_id, engine, prompt, params, chunks)


def frame_chunks(codes: torch.Tensor) -> list[StageOutput]:
    """The talker's frames as it streams them: one per step."""
    return [
        StageOutput("req", codes=codes[i : i + 1], finished=i == len(codes) - 1) for i in range(len(codes))
    ]


@pytest.fixture(scope="session")
def thinker_results(engines):
    """Each prompt's greedy thinker result (what the talker's requests are built from)."""
    return {
        name: run_stage(0, engines[0], prompt, greedy_params()[0], {}) for name, prompt in PROMPTS.items()
    }
