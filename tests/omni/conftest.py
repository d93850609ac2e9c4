"""Shared Qwen2.5-Omni fixtures: the tiny checkpoint, its processor, prompts and the reference outputs.

The reference runs once per session; every test compares against the same ground truth.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistage import GenerationParams, SamplingParams
from omnistage.demo.qwen2_5_omni import qwen2_5_omni_dir
from omnistage.models.qwen2_5_omni.processor import load_processor
from tests.omni.omni_reference import load_reference_model, run_reference

THINKER_TOKENS = 10
TALKER_TOKENS = 60  # 60 codes = 28,800 samples: several 24-code chunks in async-chunk mode
SEED = 0
# Async chunk joins windowed decodes; with the default context (3 blocks before, 2 after plus the vocoder's
# radius) the measured max difference is 1.8e-5 on a waveform of std ~0.4. See docs in token2wav.py.
ASYNC_TOLERANCE = 1e-4


def _prompts() -> dict[str, object]:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 255, (56, 84, 3), dtype=np.uint8)
    audio = (rng.standard_normal(16000) * 0.1).astype(np.float32)
    video = rng.integers(0, 255, (4, 56, 84, 3), dtype=np.uint8)
    return {
        "text": "Hello there",
        "image": {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "image": image}, {"type": "text", "text": "What?"}],
                }
            ]
        },
        "audio": {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "audio", "audio": audio}, {"type": "text", "text": "Why?"}],
                }
            ],
            "speaker": "Ethan",
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
    """Per-stage params matching the reference run: greedy thinker, greedy talker with the reference's
    repetition penalty, seeded code2wav."""
    return [
        SamplingParams(temperature=0.0, max_tokens=THINKER_TOKENS),
        SamplingParams(temperature=0.0, max_tokens=TALKER_TOKENS, repetition_penalty=1.05),
        GenerationParams(seed=SEED),
    ]


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    """Two shared cores: one intra-op thread per process avoids oversubscription stalls."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def omni_dir():
    return qwen2_5_omni_dir("tiny")


@pytest.fixture(scope="session")
def processor(omni_dir):
    return load_processor(omni_dir)


@pytest.fixture(scope="session")
def reference_model(omni_dir):
    return load_reference_model(omni_dir)


@pytest.fixture(scope="session")
def references(reference_model, processor):
    out = {}
    for name, prompt in PROMPTS.items():
        speaker = prompt.get("speaker", "Chelsie") if isinstance(prompt, dict) else "Chelsie"
        out[name] = run_reference(
            reference_model,
            processor,
            prompt,
            speaker=speaker,
            thinker_max_new_tokens=THINKER_TOKENS,
            talker_max_new_tokens=TALKER_TOKENS,
            seed=SEED,
        )
    return out
