"""The thinker's prompt as the AR engine takes it: token ids, merged multimodal embeddings, 3-row RoPE.

This is the part of `Qwen2_5OmniThinkerModel.forward` that runs before the language model (audio and
vision encoders scattered into the placeholder tokens' embeddings) and of `generate`'s position setup
(`get_rope_index`), done once per request in the thinker's process. Text-only prompts hand over bare
token ids: their positions are plain (every row `arange`, delta 0), and token ids alone keep them
eligible for prefix caching.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.families.qwen2_5_omni.processor import prompt_to_inputs
from omnistage.stages.ar.ar_inputs import ARInputs

MEDIA_KEYS = ("pixel_values", "pixel_values_videos", "input_features")


@torch.inference_mode()
def thinker_prompt(loaded: Any, prompt: Any) -> tuple[list[int], ARInputs]:
    """(prompt token ids, the AR engine's inputs)."""
    feats = prompt_to_inputs(loaded.processor, prompt)
    ids = feats["input_ids"]
    if not any(feats.get(k) is not None for k in MEDIA_KEYS):
        return ids[0].tolist(), ARInputs()
    model = loaded.thinker.model
    device = loaded.embed.weight.device
    feats = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in feats.items()}
    embeds = _merged_embeddings(model, feats)
    audio_lengths = feats["feature_attention_mask"].sum(-1) if "feature_attention_mask" in feats else None
    rope = mrope(model, feats, audio_lengths)
    inputs = ARInputs(
        inputs_embeds=embeds[0],
        position_ids=rope["mrope_positions"],
        rope_delta=rope["rope_delta"],
        output_data=rope,  # echoed in the first output: the talker continues these positions
    )
    return ids[0].tolist(), inputs


def mrope(model: Any, feats: dict[str, Any], audio_lengths: torch.Tensor | None) -> dict[str, Any]:
    """The prompt's multimodal RoPE (the thinker's `get_rope_index`, used the same way by both Qwen omni
    families): positions of batch row 0 and the delta generated tokens continue from."""
    positions, delta = model.get_rope_index(
        feats["input_ids"],
        feats.get("image_grid_thw"),
        feats.get("video_grid_thw"),
        feats["attention_mask"],
        False,
        audio_lengths,
        feats.get("video_second_per_grid"),
    )
    return {"mrope_positions": positions[:, 0].cpu(), "rope_delta": int(delta.reshape(-1)[0])}


def _merged_embeddings(model: Any, feats: dict[str, Any]) -> torch.Tensor:
    """Token embeddings with audio, image and video features written over their placeholder tokens."""
    ids = feats["input_ids"]
    embeds = model.get_input_embeddings()(ids)
    if feats.get("input_features") is not None:
        audio = model.get_audio_features(
            feats["input_features"], feats.get("feature_attention_mask"), return_dict=True
        ).last_hidden_state
        embeds = _scatter(embeds, ids == model.config.audio_token_id, audio)
    if feats.get("pixel_values") is not None:
        image = model.get_image_features(feats["pixel_values"], feats["image_grid_thw"], return_dict=True)
        embeds = _scatter(embeds, ids == model.config.image_token_id, torch.cat(image.pooler_output))
    if feats.get("pixel_values_videos") is not None:
        video = model.get_video_features(
            feats["pixel_values_videos"], feats["video_grid_thw"], return_dict=True
        )
        embeds = _scatter(embeds, ids == model.config.video_token_id, torch.cat(video.pooler_output))
    return embeds


def _scatter(embeds: torch.Tensor, mask: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    if int(mask.sum()) != features.shape[0]:
        from omnistage.errors import InvalidRequestError

        raise InvalidRequestError(
            f"the prompt has {int(mask.sum())} placeholder tokens for {features.shape[0]} feature rows",
            param="multi_modal_data",
        )
    features = features.to(embeds.device, embeds.dtype)
    return embeds.masked_scatter(mask.unsqueeze(-1), features)
