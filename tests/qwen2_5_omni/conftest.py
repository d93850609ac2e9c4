"""Shared Qwen2.5-Omni fixtures: the tiny checkpoint, its processor, prompts and the reference outputs.

The reference runs once per session; every test compares against the same ground truth.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage import GenerationParams, SamplingParams
from omnistage.families.qwen2_5_omni.processor import load_processor
from omnistage.families.qwen2_5_omni.tiny import qwen2_5_omni_dir
from tests.qwen2_5_omni.omni_reference import load_reference_model, run_reference

THINKER_TOKENS = 10
TALKER_TOKENS = 60  # 60 codes = 28,800 samples: several 24-code chunks in async-chunk mode
SEED = 0
# Async chunk joins windowed decodes (see token2wav.py). With the default context (3 blocks before a chunk,
# 2 after plus the vocoder's radius) every chunk after the first is within 1.8e-5 of the one-pass decode on a
# waveform of std ~0.4. The first chunk looks one block ahead only (its audio starts 12 codes sooner):
# ~1e-3 off, i.e. ~60 dB below the signal (73-77 dB SNR measured on the benchmark checkpoint).
ASYNC_TOLERANCE = 1e-4
FIRST_CHUNK_TOLERANCE = 3e-3


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


def first_chunk_samples(omni_dir) -> int:
    """Audio samples of a request's first async chunk (one DiT block of codes)."""
    config = json.loads((Path(omni_dir) / "config.json").read_text())["token2wav_config"]
    return config["dit_config"]["block_size"] * math.prod(config["bigvgan_config"]["upsample_rates"])


def assert_async_audio_close(audio: torch.Tensor, whole: torch.Tensor, omni_dir) -> None:
    """Async-chunk audio against the one-pass decode: the first chunk within its tolerance, the rest within
    `ASYNC_TOLERANCE`."""
    first = first_chunk_samples(omni_dir)
    assert audio.shape == whole.shape and audio.numel() > first
    assert float((audio[:first] - whole[:first]).abs().max()) <= FIRST_CHUNK_TOLERANCE
    assert float((audio[first:] - whole[first:]).abs().max()) <= ASYNC_TOLERANCE


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
