"""Ground truth for the Qwen2.5-Omni tests: the composite transformers model's own
`generate(..., return_audio=True)`, greedy, with what it produced at each stage captured."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from transformers import Qwen2_5OmniForConditionalGeneration

from omnistage.families.qwen2_5_omni.processor import prompt_to_inputs


@dataclasses.dataclass
class ReferenceOutput:
    prompt_ids: list[int]
    text_ids: list[int]  # the thinker's generated tokens
    talker_ids: list[int]  # the talker's generated codec tokens, including a final codec EOS if it stopped
    codes: list[int]  # what code2wav decoded: talker tokens before the first codec EOS
    waveform: torch.Tensor  # float32 mono, 24 kHz


def load_reference_model(model_dir: Any) -> Qwen2_5OmniForConditionalGeneration:
    return Qwen2_5OmniForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


def run_reference(
    model: Qwen2_5OmniForConditionalGeneration,
    processor: Any,
    prompt: Any,
    *,
    speaker: str = "Chelsie",
    thinker_max_new_tokens: int = 8,
    talker_max_new_tokens: int = 32,
    seed: int = 0,
    left_pad: bool = True,
) -> ReferenceOutput:
    """Greedy thinker and talker (the talker keeps its default repetition penalty 1.05 and EOS ids); the
    DiT's initial noise comes from the global generator seeded with `seed` right before `generate`.

    `left_pad` prepends one masked pad token. Why: transformers 5's `generate` drops an attention mask that
    is all ones, and the composite model's talker keys off that mask: without it, the talker's prefill skips
    the codec pad/BOS embeddings on its last two prompt rows and uses plain instead of multimodal RoPE
    positions. With one masked token the reference takes the path the model was designed (and trained)
    with, which is what omnistage implements; the pad changes nothing else (masked, positions skip it).
    """
    inputs = dict(prompt_to_inputs(processor, prompt))
    if left_pad:
        pad = model.config.thinker_config.text_config.pad_token_id
        inputs["input_ids"] = torch.cat([torch.full((1, 1), pad), inputs["input_ids"]], dim=1)
        mask = inputs["attention_mask"]
        inputs["attention_mask"] = torch.cat([torch.zeros(1, 1, dtype=mask.dtype), mask], dim=1)
    for key in ("pixel_values", "pixel_values_videos"):
        if key in inputs:  # the composite generate would hand them to the talker too
            inputs[f"thinker_{key}"] = inputs.pop(key)
    captured: dict[str, torch.Tensor] = {}
    talker_generate = model.talker.generate

    def capture_talker(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = talker_generate(*args, **kwargs)
        captured["talker"] = out[:, kwargs["input_ids"].shape[1] :]
        return out

    model.talker.generate = capture_talker
    try:
        torch.manual_seed(seed)
        sequences, waveform = model.generate(
            **inputs,
            speaker=speaker,
            thinker_max_new_tokens=thinker_max_new_tokens,
            thinker_do_sample=False,
            talker_max_new_tokens=talker_max_new_tokens,
            talker_do_sample=False,
        )
    finally:
        del model.talker.generate
    prompt_len = inputs["input_ids"].shape[1]
    talker_ids = captured["talker"][0].tolist()
    eos = {model.talker.codec_eos_token, model.talker.codec_pad_token}
    stop = next((i for i, t in enumerate(talker_ids) if t in eos), len(talker_ids))
    return ReferenceOutput(
        prompt_ids=inputs["input_ids"][0, int(left_pad) :].tolist(),
        text_ids=sequences[0, prompt_len:].tolist(),
        talker_ids=talker_ids,
        codes=talker_ids[:stop],
        waveform=waveform.reshape(-1).float(),
    )
