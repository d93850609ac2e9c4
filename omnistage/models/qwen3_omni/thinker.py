"""The Qwen3-Omni thinker's prompt as the AR engine takes it: token ids, merged audio embeddings and 3-row
interleaved multimodal RoPE (the part of `Qwen3OmniMoeThinkerModel.forward` before its language model).

Text-only prompts hand over bare token ids (plain positions, prefix caching). Images and videos are refused
for now: the thinker adds their deepstack features to the hidden states after its first layers, which the
AR engine cannot inject yet, and answering without them would be silently wrong.

What the talker needs from a prompt with audio rides along in the first output (`output_data`): the RoPE
inputs (audio feature lengths) its own `get_rope_index` takes.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.qwen2_5_omni.processor import prompt_to_inputs
from omnistage.models.qwen2_5_omni.thinker import _scatter


@torch.inference_mode()
def thinker_prompt(loaded: Any, prompt: Any) -> tuple[list[int], dict[str, Any]]:
    """(prompt token ids, `StageRequest.inputs` for the AR engine)."""
    feats = prompt_to_inputs(loaded.processor, prompt)
    for key, name in (("pixel_values", "image"), ("pixel_values_videos", "video")):
        if feats.get(key) is not None:
            raise InvalidRequestError(
                f"{name} input is not served for Qwen3-Omni yet (its deepstack vision features)",
                param=f"multi_modal_data.{name}",
            )
    ids = feats["input_ids"]
    if feats.get("input_features") is None:
        return ids[0].tolist(), {}
    model = loaded.thinker.model
    device = loaded.embed.weight.device
    feats = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in feats.items()}
    embeds = model.get_input_embeddings()(ids.to(device))
    audio = model.get_audio_features(
        feats["input_features"], feats["feature_attention_mask"], return_dict=True
    ).last_hidden_state
    embeds = _scatter(embeds, feats["input_ids"] == model.config.audio_token_id, audio)
    audio_lengths = feats["feature_attention_mask"].sum(-1)
    positions, delta = model.get_rope_index(
        feats["input_ids"], None, None, feats["attention_mask"], False, audio_lengths, None
    )
    rope = {"mrope_positions": positions[:, 0].cpu(), "rope_delta": int(delta.reshape(-1)[0])}
    return ids[0].tolist(), {
        "inputs_embeds": embeds[0],
        "position_ids": rope["mrope_positions"],
        "rope_delta": rope["rope_delta"],
        "output_data": {"audio_feature_lengths": audio_lengths.cpu().tolist()},
    }
