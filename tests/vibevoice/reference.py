"""The VibeVoice reference, transformers' `VibeVoiceForConditionalGeneration.generate`, called as its users
call it, with the diffusion head's noise replaced by omnistage's per-request, per-step noise (`same_noise`:
the reference draws it with `torch.randn`, once a frame), its latents observed, and the scripts and prompts
the VibeVoice tests share.

The tiny checkpoint speaks until its cap (tiny.py); a *script* forces the LM's choice step by step on both
sides alike ("." another frame, "e" a segment's end, "B" a new segment, "E" the end of speech; past its
end, free choice): the reference through a `LogitsProcessor`, omnistage through a request logits processor
(`script_*` below, by dotted path)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from omnistage.families.shared.step_noise import step_noise
from omnistage.families.vibevoice.tiny import TINY, tiny_vibevoice_dir

PROMPTS = [
    "Hello there, a test!",
    "Speaker 0: The quick brown fox.\nSpeaker 1: Jumps over the lazy dog.",
    "A small model learned to speak.",
    "How are you today?",
]
SEEDS = [7, 8, 9, 10]
MAX_NEW = 16
# segments ended and restarted, a frame straight after a segment's end (the branch skips the end), the end
SCRIPTS = {"a": "...eB....eB..E", "b": "..e...eB...e..", "c": "", "d": ".eB..."}
IDS = dict(zip(("eos", "bos", "end", "token"), [TINY["specials"][m] for m in TINY["specials"]], strict=True))
CHARS = {".": "token", "e": "end", "B": "bos", "E": "eos"}


def forced(script: str, step: int, logits: torch.Tensor) -> torch.Tensor:
    if step >= len(script):
        return logits
    out = torch.full_like(logits, float("-inf"))
    out[..., IDS[CHARS[script[step]]]] = 0.0
    return out


def script_a(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    return forced(SCRIPTS["a"], len(output_ids), logits)


def script_b(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    return forced(SCRIPTS["b"], len(output_ids), logits)


def script_d(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    return forced(SCRIPTS["d"], len(output_ids), logits)


PROCESSORS = {
    "a": "tests.vibevoice.reference:script_a",
    "b": "tests.vibevoice.reference:script_b",
    "c": None,
    "d": "tests.vibevoice.reference:script_d",
}


@functools.cache
def reference_model() -> Any:
    from transformers import VibeVoiceForConditionalGeneration

    return VibeVoiceForConditionalGeneration.from_pretrained(str(tiny_vibevoice_dir())).eval()


class _Steps:
    """A `LogitsProcessor` that counts the steps (and forces a script's tokens)."""

    def __init__(self, script: str):
        self.script, self.step = script, -1

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.step += 1
        return forced(self.script, self.step, scores)


class _Noise:
    """`torch` as the reference's generation loop sees it: `randn` gives the current step's noise of
    `seed` (the step read from the step counter)."""

    def __init__(self, seed: int, steps: _Steps):
        self.seed, self.steps = seed, steps

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def randn(self, rows: int, size: int) -> torch.Tensor:
        noise = step_noise(self.seed, self.steps.step, (size,))
        return noise[None].expand(rows, size).clone()


@contextlib.contextmanager
def same_noise(seed: int, steps: _Steps) -> Iterator[None]:
    import transformers.models.vibevoice.generation_vibevoice as generation

    saved, generation.torch = generation.torch, _Noise(seed, steps)
    try:
        yield
    finally:
        generation.torch = saved


def reference(
    ids: list[int],
    seed: int,
    script: str = "",
    max_new: int = MAX_NEW,
    input_values: Any = None,
    padding_mask: Any = None,
    model: Any = None,
) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """`generate` on `ids` (its defaults: the checkpoint's guidance 1.3, 10 diffusion steps) with our noise:
    (the generated tokens, the latents [F, D], the waveform [samples]). `model`: the tiny checkpoint's
    unless given."""
    from transformers import LogitsProcessorList

    model = model or reference_model()
    steps = _Steps(script)
    made: list[torch.Tensor] = []
    sample = model._sample_audio_latent

    def observed(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = sample(*args, **kwargs)
        made.append(out[:, 0])
        return out

    model._sample_audio_latent = observed
    prompt = torch.tensor([ids])
    extra = {} if input_values is None else {"input_values": input_values, "padding_mask": padding_mask}
    try:
        torch.manual_seed(seed)  # the clips' σ-VAE noise, drawn first (omnistage draws it from the seed)
        with same_noise(seed, steps), torch.inference_mode():
            out = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=max_new,
                logits_processor=LogitsProcessorList([steps]),
                return_dict_in_generate=True,
                **extra,
            )
    finally:
        del model._sample_audio_latent
    audio = out.audio[0]
    wave = torch.empty(0) if audio is None else audio.reshape(-1)
    latents = torch.cat(made) if made else torch.empty(0, model.config.audio_config.hidden_size)
    return out.sequences[0, len(ids) :].tolist(), latents, wave


def clip(seconds: float = 0.05, pitch: float = 140.0, rate: int = 24000) -> np.ndarray:
    """A voiced-like signal (harmonics under a syllable envelope) at the model's rate."""
    t = np.arange(int(rate * seconds)) / rate
    tone = sum(np.sin(2 * np.pi * pitch * k * t) / k for k in range(1, 6))
    return (0.2 * tone * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)
