"""The Higgs Audio v2 reference, transformers' own `HiggsAudioV2ForConditionalGeneration.generate`, called as
its users call it (`AutoProcessor.apply_chat_template` for the inputs, `processor.decode` for the waveform),
and the prompts the Higgs tests share."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from omnistage.families.higgs_audio_v2.tiny import tiny_higgs_dir

MAX_NEW = 24  # frames: some prompts end before (their all-EOS frame), others run to the limit
SYSTEM = "Generate audio following instruction."


def clip(seconds: float = 1.0, pitch: float = 140.0) -> np.ndarray:
    """A voiced-like signal (harmonics under a syllable envelope) at 24 kHz."""
    t = np.arange(int(24000 * seconds)) / 24000
    tone = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
    return (0.2 * tone * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


# Each: (text to say, scene or None, voice reference (its transcript, its clip) or None)
PROMPTS = [
    ("Hello there, how are you?", None, None),
    ("The quick brown fox.", "Audio is recorded from a quiet room.", None),
    ("Numbers: one two three.", None, None),
    ("A longer sentence about the sun rising in the east.", None, None),
]
CLONE = ("The sun rises in the east.", None, ("It was the night before my birthday.", clip(0.8, 180.0)))


@functools.cache
def reference_model() -> Any:
    from transformers import AutoProcessor, HiggsAudioV2ForConditionalGeneration

    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(tiny_higgs_dir()).eval()
    return model, AutoProcessor.from_pretrained(tiny_higgs_dir())


def conversation(text: str, scene: str | None, voice: tuple | None) -> list[dict]:
    messages = [{"role": "system", "content": [{"type": "text", "text": SYSTEM}]}]
    if scene is not None:
        messages.append({"role": "scene", "content": [{"type": "text", "text": scene}]})
    if voice is not None:
        messages.append({"role": "user", "content": [{"type": "text", "text": voice[0]}]})
        messages.append({"role": "assistant", "content": [{"type": "audio", "audio": voice[1]}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
    return messages


def reference_inputs(text: str, scene: str | None, voice: tuple | None) -> dict:
    _, processor = reference_model()
    return processor.apply_chat_template(
        conversation(text, scene, voice),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
    )


@functools.cache
def _generate(text: str, scene: str | None, voice_key: Any) -> Any:
    voice = CLONE[2] if voice_key else None
    model, _ = reference_model()
    inputs = reference_inputs(text, scene, voice)
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True)
    new = out.sequences.shape[1] - inputs["input_ids"].shape[1]
    return out.audio_sequences[:, -new:], out.sequences[0, inputs["input_ids"].shape[1] :]


def reference_codes(text: str, scene: str | None, voice: tuple | None) -> torch.Tensor:
    """The generated frames [N, K] (the all-EOS last frame included where the request ended on it)."""
    return _generate(text, scene, voice is not None)[0][0]


def reference_tokens(text: str, scene: str | None, voice: tuple | None) -> list[int]:
    return _generate(text, scene, voice is not None)[1].tolist()


def reference_waveform(text: str, scene: str | None, voice: tuple | None) -> torch.Tensor:
    """`processor.decode` of the generated frames (as its users decode: from the all-BOS first frame to the
    all-EOS one, the delay pattern reverted)."""
    _, processor = reference_model()
    with torch.no_grad():
        return processor.decode(reference_codes(text, scene, voice)[None])
