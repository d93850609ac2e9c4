"""The Dia reference, transformers' own `DiaProcessor` → `DiaForConditionalGeneration.generate`, called as its
users call it (the checkpoint's generation config: classifier-free guidance 3.0 with its top-k 45; greedy
where a test says so), and the prompts the Dia tests share."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from omnistage.families.dia.tiny import TINY, tiny_dia_dir

MAX_NEW = 40  # frames: prompts 0, 2, 3 end on their own (EOS), 1 at the limit
TOP_K = 45  # the checkpoint's (Dia-1.6B's): also the guidance's top-k when greedy
# The guidance's top-k the greedy tests decode with: guidance keeps the conditional logits within the guided
# logits' top k, and on the tiny 68-id vocabulary the checkpoint's 45 never excludes the conditional argmax
# (greedy frames with and without guidance are the same); 2 lets the guidance decide frames.
GUIDED_TOP_K = 2
DECODER = TINY["decoder_config"]
# The processor's defaults are Dia-1.6B's (9 channels, ids 1024..1026): the tiny checkpoint's are passed.
AUDIO_KWARGS = {
    "delay_pattern": TINY["delay_pattern"],
    "bos_token_id": DECODER["bos_token_id"],
    "eos_token_id": DECODER["eos_token_id"],
    "pad_token_id": DECODER["pad_token_id"],
}
PROMPTS = [
    "[S1] Hello there, a test! [S2] Hi.",
    "[S1] The quick brown fox jumps over the lazy dog.",
    "[S2] A small model learned to speak. [S1] Really? (laughs)",
    "[S1] How are you today? [S2] I am fine, thank you. [S1] Good.",
]


def clip(seconds: float = 0.3, pitch: float = 140.0) -> np.ndarray:
    """A voiced-like signal (harmonics under a syllable envelope) at 44.1 kHz."""
    t = np.arange(int(44100 * seconds)) / 44100
    tone = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
    return (0.2 * tone * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


@functools.cache
def reference_model() -> Any:
    from transformers import DiaForConditionalGeneration, DiaProcessor

    model = DiaForConditionalGeneration.from_pretrained(tiny_dia_dir()).eval()
    return model, DiaProcessor.from_pretrained(tiny_dia_dir())


def reference_inputs(text: str | list[str], audio: Any = None) -> dict:
    _, processor = reference_model()
    return processor(text=text, audio=audio, padding=True, return_tensors="pt", **AUDIO_KWARGS)


def reference_codes(
    text: str,
    audio: Any = None,
    max_new: int = MAX_NEW,
    guidance_scale: float | None = None,
    top_k: int = GUIDED_TOP_K,
) -> torch.Tensor:
    """The reference's greedy output [T, C] (the delayed frames, the decoder prefix first), with the
    checkpoint's classifier-free guidance (`guidance_scale` None: 3.0) or the one given (1: off), and the
    guidance's top-k; asserts `generate` took the path asked (an unconditioned twin a request, or none)."""
    model, _ = reference_model()
    scale = {} if guidance_scale is None else {"guidance_scale": guidance_scale}
    with torch.inference_mode():
        out = model.generate(
            **reference_inputs(text, audio), max_new_tokens=max_new, do_sample=False, top_k=top_k, **scale
        )
    assert model._uses_cfg is (guidance_scale != 1.0)
    assert model.generation_config.guidance_scale == 3.0 and model.generation_config.top_k == TOP_K
    return out[0]


def reference_audio(codes: torch.Tensor, audio_prompt_len: int | None = None) -> torch.Tensor:
    """The reference's waveform for its own output [T, C]: `DiaProcessor.batch_decode` (reverts the delay,
    cuts BOS / the prompt and EOS / padding, DAC-decodes)."""
    _, processor = reference_model()
    return processor.batch_decode(codes[None], audio_prompt_len=audio_prompt_len, **AUDIO_KWARGS)[0]
