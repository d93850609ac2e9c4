"""The CSM reference, transformers' own `CsmForConditionalGeneration.generate`, called as its users call it
(`AutoProcessor.apply_chat_template` for the inputs), and the prompts the CSM tests share."""

from __future__ import annotations

import functools
import io
from typing import Any

import numpy as np
import soundfile
import torch

from omnistage.families.csm.tiny import tiny_csm_dir

MAX_NEW = 12  # frames


def clip(seconds: float = 1.5, pitch: float = 140.0) -> np.ndarray:
    """A voiced-like signal (harmonics under a syllable envelope) at 24 kHz."""
    t = np.arange(int(24000 * seconds)) / 24000
    tone = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
    return (0.2 * tone * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def wav(samples: np.ndarray) -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, 24000, format="WAV", subtype="FLOAT")
    return out.getvalue()


# Each: (new turn's text, its speaker, earlier turns [(speaker, text, clip)])
PROMPTS = [
    ("Hello there, a test!", 0, []),
    ("The quick brown fox jumps over the lazy dog.", 1, []),
    ("A small model learned to speak.", 0, [(1, "Once upon a time.", clip(1.0, 180.0))]),
    ("How are you today?", 1, [(0, "Hello world!", clip(0.8, 120.0)), (1, "I am fine.", clip(1.2, 200.0))]),
]


@functools.cache
def reference_model() -> Any:
    from transformers import AutoProcessor, CsmForConditionalGeneration

    model = CsmForConditionalGeneration.from_pretrained(tiny_csm_dir()).eval()
    return model, AutoProcessor.from_pretrained(tiny_csm_dir())


def conversation(text: str, speaker: int, turns: list) -> list[dict]:
    messages = [
        {"role": str(s), "content": [{"type": "text", "text": t}, {"type": "audio", "path": a}]}
        for s, t, a in turns
    ]
    return [*messages, {"role": str(speaker), "content": [{"type": "text", "text": text}]}]


def reference_inputs(text: str, speaker: int, turns: list) -> dict:
    _, processor = reference_model()
    return processor.apply_chat_template(conversation(text, speaker, turns), tokenize=True, return_dict=True)


def reference_codes(text: str, speaker: int, turns: list, max_new: int = MAX_NEW, **sampling) -> torch.Tensor:
    """The reference's frames [T, K] (greedy unless `sampling` says otherwise)."""
    model, _ = reference_model()
    sampling = sampling or {"do_sample": False, "depth_decoder_do_sample": False}
    with torch.inference_mode():
        out = model.generate(**reference_inputs(text, speaker, turns), max_new_tokens=max_new, **sampling)
    return out[0]


def reference_audio(codes: torch.Tensor) -> torch.Tensor:
    """The reference's waveform for frames [T, K] (`generate(output_audio=True)`'s decode)."""
    model, _ = reference_model()
    with torch.inference_mode():
        return model.codec_model.decode(codes.transpose(0, 1).unsqueeze(0)).audio_values[0, 0]
