"""Shared Qwen3-Omni fixtures: the tiny checkpoint, its processor, prompts and the reference outputs (the
reference runs once per session; every test compares against the same ground truth)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import SamplingParams
from omnistage.models.qwen3_omni.checkpoint import qwen3_omni_dir
from tests.qwen3_omni.reference import load_reference_model, run_reference

THINKER_TOKENS = 10
# The reference feeds back every talker token but the last, so N talker tokens give N - 1 frames;
# omnistage's post-sample hook makes a frame for every token it samples: max_tokens = FRAMES gives the
# reference's first FRAMES frames.
FRAMES = 40


def _prompts() -> dict[str, object]:
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(16000) * 0.1).astype(np.float32)
    return {
        "text": "Hello there",
        "audio": {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "audio", "audio": audio}, {"type": "text", "text": "Why?"}],
                }
            ],
            "speaker": "Chelsie",
        },
    }


PROMPTS = _prompts()


def greedy_params() -> list[object]:
    """Per-stage params matching the reference run: greedy thinker and talker (no repetition penalty)."""
    return [
        SamplingParams(temperature=0.0, max_tokens=THINKER_TOKENS),
        SamplingParams(temperature=0.0, max_tokens=FRAMES, repetition_penalty=1.0),
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

    from omnistage.models.qwen2_5_omni.processor import load_processor

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
