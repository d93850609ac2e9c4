"""Ground truth for the Qwen3-Omni tests: the composite transformers model's own
`generate(..., return_audio=True)`, greedy, with the talker's frames captured."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import Qwen3OmniMoeForConditionalGeneration

from omnistage.families.qwen2_5_omni.processor import prompt_to_inputs


@dataclasses.dataclass
class ReferenceOutput:
    prompt_ids: list[int]
    text_ids: list[int]  # the thinker's generated tokens
    talker_ids: list[int]  # the talker's sampled codebook-0 tokens (the last one has no frame)
    codes: torch.Tensor  # [frames, 16]: what code2wav decoded
    waveform: torch.Tensor  # float32 mono, 24 kHz


def load_reference_model(model_dir: Any) -> Qwen3OmniMoeForConditionalGeneration:
    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


def run_reference(
    model: Qwen3OmniMoeForConditionalGeneration,
    processor: Any,
    prompt: Any,
    *,
    speaker: str = "Ethan",
    thinker_max_new_tokens: int = 8,
    talker_max_new_tokens: int = 32,
) -> ReferenceOutput:
    """Greedy thinker, talker and code predictor (`talker_do_sample=False`); the talker keeps its default
    repetition penalty (1.05, over its generated codes: its prompt ids are all the suppressed codec pad)."""
    inputs = dict(prompt_to_inputs(processor, prompt))
    captured: dict[str, Any] = {}
    talker_generate = model.talker.generate

    def capture_talker(*args: Any, **kwargs: Any) -> Any:
        captured["talker"] = out = talker_generate(*args, **kwargs)
        return out

    model.talker.generate = capture_talker
    try:
        sequences, waveform = model.generate(
            **inputs,
            speaker=speaker,
            thinker_max_new_tokens=thinker_max_new_tokens,
            thinker_do_sample=False,
            talker_max_new_tokens=talker_max_new_tokens,
            talker_do_sample=False,
            talker_repetition_penalty=1.05,
        )
    finally:
        del model.talker.generate
    talker = captured["talker"]
    # As `generate` builds them: each step's [codebook 0, residual codes] of the token fed back.
    codes = torch.stack([hid[-1] for hid in talker.hidden_states if hid[-1] is not None], dim=1)[0]
    prompt_len = inputs["input_ids"].shape[1]
    return ReferenceOutput(
        prompt_ids=inputs["input_ids"][0].tolist(),
        text_ids=sequences[0, prompt_len:].tolist(),
        talker_ids=talker.sequences[0].tolist(),
        codes=codes,
        waveform=waveform.reshape(-1).float(),
    )
