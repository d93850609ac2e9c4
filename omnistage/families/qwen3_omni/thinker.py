"""The Qwen3-Omni thinker's prompt as the AR engine takes it: token ids, merged audio/image/video
embeddings, 3-row interleaved multimodal RoPE and the vision encoder's DeepStack features (added to the
hidden states of the vision positions after the first decoder layers, the request's `DeepStack` extension):
the part of `Qwen3OmniMoeThinkerModel.forward` before its language model, done once per request.

Text-only prompts hand over bare token ids (plain positions, prefix caching). What the talker's own
`get_rope_index` needs (audio feature lengths, image/video grids) rides along in the first output
(`output_data`).
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.families.qwen2_5_omni.processor import prompt_to_inputs
from omnistage.families.qwen2_5_omni.thinker import MEDIA_KEYS, _scatter, mrope
from omnistage.families.qwen3_omni.deepstack import DeepStack
from omnistage.stages.ar.ar_inputs import ARInputs


@torch.inference_mode()
def thinker_prompt(loaded: Any, prompt: Any) -> tuple[list[int], ARInputs]:
    """(prompt token ids, the AR engine's inputs)."""
    feats = prompt_to_inputs(loaded.processor, prompt)
    ids = feats["input_ids"]
    if not any(feats.get(k) is not None for k in MEDIA_KEYS):
        return ids[0].tolist(), ARInputs()
    model = loaded.thinker.model
    config = model.config
    device = loaded.embed.weight.device
    feats = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in feats.items()}
    ids = feats["input_ids"]
    embeds = model.get_input_embeddings()(ids)
    audio_lengths = None
    if feats.get("input_features") is not None:
        audio = model.get_audio_features(
            feats["input_features"], feats["feature_attention_mask"], return_dict=True
        ).last_hidden_state
        embeds = _scatter(embeds, ids == config.audio_token_id, audio)
        audio_lengths = feats["feature_attention_mask"].sum(-1)
    deepstack = torch.zeros(0)
    visual = torch.zeros_like(ids[0], dtype=torch.bool)
    for pixels, grid, token, encode in (
        ("pixel_values", "image_grid_thw", config.image_token_id, model.get_image_features),
        ("pixel_values_videos", "video_grid_thw", config.video_token_id, model.get_video_features),
    ):
        if feats.get(pixels) is None:
            continue
        out = encode(feats[pixels], feats[grid], return_dict=True)
        mask = ids == token
        embeds = _scatter(embeds, mask, torch.cat(out.pooler_output))
        layers = torch.stack([torch.cat(f) for f in out.deepstack_features])  # [K, rows, H]
        if deepstack.numel() == 0:
            deepstack = torch.zeros(layers.shape[0], ids.shape[1], layers.shape[2], dtype=embeds.dtype)
        deepstack[:, mask[0].cpu()] = layers.to("cpu", embeds.dtype)
        visual |= mask[0]
    rope = mrope(model, feats, audio_lengths)
    talker_rope = {
        "audio_feature_lengths": None if audio_lengths is None else audio_lengths.cpu().tolist(),
        **{
            k: feats[k].cpu().tolist()
            for k in ("image_grid_thw", "video_grid_thw")
            if feats.get(k) is not None
        },
    }
    if feats.get("video_second_per_grid") is not None:
        talker_rope["video_second_per_grid"] = torch.as_tensor(feats["video_second_per_grid"]).tolist()
    inputs = ARInputs(
        inputs_embeds=embeds[0],
        position_ids=rope["mrope_positions"],
        rope_delta=rope["rope_delta"],
        output_data={"talker_rope": talker_rope},
    )
    if deepstack.numel():
        inputs.extension = DeepStack(deepstack, visual.cpu())
    return ids[0].tolist(), inputs
