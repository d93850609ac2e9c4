"""Tiny Qwen3-Omni checkpoints with the real layout, built locally from random weights.

A real release's shape: one `config.json` (`Qwen3OmniMoeForConditionalGeneration`), weights under the
`thinker.` / `talker.` / `code2wav.` prefixes, the tokenizer and one nested `processor_config.json`. Only
widths, depths and expert counts shrink: the thinker vocabulary stays 152064 and every special id (audio
151675, tts pad/bos/eos 151671-151673, codec ids 2148-2157, speakers 2301-2303, the chat-template words)
is the real model's, because the talker's prompt is cut out of the thinker's by those ids.

Two sizes: `tiny` for tests and `bench`, sized like the Qwen2.5-Omni bench checkpoint.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from omnistage.cache import cached_dir
from omnistage.families.qwen2_5_omni.tiny import build_tokenizer, processor_config

logger = logging.getLogger(__name__)

VERSION = "1"
SEED = 0
ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"
# The real Qwen3-Omni added tokens, in id order from 151643.
ADDED_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
EXTRA_SPECIAL_TOKENS = {
    "image_token": "<|image_pad|>",
    "audio_token": "<|audio_pad|>",
    "video_token": "<|video_pad|>",
    "vision_bos_token": "<|vision_start|>",
    "vision_eos_token": "<|vision_end|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'audio' or 'audio' in part or 'audio_url' in part %}"
    "<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
CODEC = {"pad": 2148, "bos": 2149, "eos": 2150, "nothink": 2155, "think_bos": 2156, "think_eos": 2157}

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "text": {"hidden": 64, "layers": 4, "heads": 4, "kv_heads": 2, "experts": 4, "moe_ffn": 32},
        "talker": {
            "hidden": 32,
            "ffn": 64,
            "layers": 2,
            "heads": 2,
            "kv_heads": 1,
            "experts": 4,
            "moe_ffn": 32,
        },
        "predictor": {"hidden": 32, "ffn": 64, "layers": 2, "heads": 2, "kv_heads": 1},
        "code2wav": {"hidden": 32, "ffn": 64, "layers": 2, "decoder_dim": 64},
        "accept_hidden_layer": 2,
    },
    # Several times the tiny widths, like the Qwen2.5-Omni bench checkpoint.
    "bench": {
        "text": {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "experts": 8, "moe_ffn": 256},
        "talker": {
            "hidden": 256,
            "ffn": 512,
            "layers": 4,
            "heads": 4,
            "kv_heads": 2,
            "experts": 4,
            "moe_ffn": 256,
        },
        "predictor": {"hidden": 256, "ffn": 512, "layers": 2, "heads": 4, "kv_heads": 2},
        "code2wav": {"hidden": 64, "ffn": 128, "layers": 2, "decoder_dim": 128},
        "accept_hidden_layer": 2,
    },
}
# The bench widths with head_dim 32, the smallest vLLM's CPU attention runs: for measuring against vLLM-Omni
# on this CPU (benchmarks/vs_vllm_omni_speech.py, ../shared/peers/vllm_omni_cpu).
SIZES["peer"] = {**SIZES["bench"], "head_dim": 32, "mrope_section": [6, 5, 5]}


def build_config(size: str = "tiny") -> Any:
    from transformers import Qwen3OmniMoeConfig

    s = SIZES[size]
    text, talker, predictor, c2w = s["text"], s["talker"], s["predictor"], s["code2wav"]
    head_dim = s.get("head_dim", 16)
    # Interleaved multimodal RoPE; the sections must fit in head_dim / 2 (the real [24, 20, 20] needs 128).
    sections = s.get("mrope_section", [3, 3, 2])
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": sections, "interleaved": True}
    ids = {"audio_token_id": 151675, "image_token_id": 151655, "video_token_id": 151656}
    thinker = {
        "text_config": {
            "vocab_size": 152064,
            "hidden_size": text["hidden"],
            "intermediate_size": 2 * text["hidden"],
            "moe_intermediate_size": text["moe_ffn"],
            "num_hidden_layers": text["layers"],
            "num_attention_heads": text["heads"],
            "num_key_value_heads": text["kv_heads"],
            "head_dim": head_dim,
            "num_experts": text["experts"],
            "num_experts_per_tok": 2,
            "rope_parameters": rope,
            "max_position_embeddings": 32768,
            "eos_token_id": 151645,
            "pad_token_id": 151643,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "depth": 2,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "out_hidden_size": text["hidden"],
            "deepstack_visual_indexes": [0, 1],
            "num_position_embeddings": 2304,
        },
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": 2,
            "encoder_attention_heads": 2,
            "encoder_ffn_dim": 64,
            "d_model": 32,
            "downsample_hidden_size": 16,
            "n_window": 50,
            "output_dim": text["hidden"],
        },
        **ids,
        "audio_start_token_id": 151669,
        "vision_start_token_id": 151652,
        "position_id_per_seconds": 13,
        "user_token_id": 872,
        "tie_word_embeddings": False,
    }
    talker_cfg = {
        "text_config": {
            "vocab_size": 3072,
            "hidden_size": talker["hidden"],
            "intermediate_size": talker["ffn"],
            "moe_intermediate_size": talker["moe_ffn"],
            "shared_expert_intermediate_size": talker["moe_ffn"],
            "num_hidden_layers": talker["layers"],
            "num_attention_heads": talker["heads"],
            "num_key_value_heads": talker["kv_heads"],
            "head_dim": head_dim,
            "num_experts": talker["experts"],
            "num_experts_per_tok": 2,
            "rope_parameters": rope,
            "max_position_embeddings": 32768,
        },
        "code_predictor_config": {
            "vocab_size": 2048,
            "hidden_size": predictor["hidden"],
            "intermediate_size": predictor["ffn"],
            "num_hidden_layers": predictor["layers"],
            "num_attention_heads": predictor["heads"],
            "num_key_value_heads": predictor["kv_heads"],
            "head_dim": head_dim,
            "num_code_groups": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        },
        "num_code_groups": 16,
        "thinker_hidden_size": text["hidden"],
        "accept_hidden_layer": s["accept_hidden_layer"],
        "codec_eos_token_id": CODEC["eos"],
        "codec_pad_id": CODEC["pad"],
        "codec_bos_id": CODEC["bos"],
        "codec_nothink_id": CODEC["nothink"],
        "codec_think_bos_id": CODEC["think_bos"],
        "codec_think_eos_id": CODEC["think_eos"],
        **ids,
        "vision_start_token_id": 151652,
        "audio_start_token_id": 151669,
        "position_id_per_seconds": 13,
        "speaker_id": SPEAKERS,
        "spatial_merge_size": 2,
    }
    code2wav = {
        "codebook_size": 2048,
        "hidden_size": c2w["hidden"],
        "intermediate_size": c2w["ffn"],
        "num_hidden_layers": c2w["layers"],
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_quantizers": 16,
        "decoder_dim": c2w["decoder_dim"],
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
        "sliding_window": 72,
    }
    config = Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker_cfg, code2wav_config=code2wav)
    config.architectures = [ARCHITECTURE]
    return config


def initialise(model: torch.nn.Module, generator: torch.Generator, wave_std: float = 0.2) -> None:
    """Seeded weights where transformers leaves them unusable.

    The talker's experts are `torch.empty` and never initialised (the talker inherits the thinker text
    class's `_init_weights`) and its routers start at zero: both get N(0, 0.02). code2wav's default init
    gives a waveform of std ~1e-7, which would let any waveform comparison pass: its layers get unit-gain
    weights and zero biases (no DC offset), its last convolution scaled so a random code gives std
    `wave_std`."""
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m

    with torch.no_grad():
        for module in model.talker.modules():
            if isinstance(module, m.Qwen3OmniMoeTalkerTextExperts):
                module.gate_up_proj.normal_(0.0, 0.02, generator=generator)
                module.down_proj.normal_(0.0, 0.02, generator=generator)
            elif isinstance(module, m.Qwen3OmniMoeTalkerTextTopKRouter):
                module.weight.normal_(0.0, 0.02, generator=generator)
        code2wav = model.code2wav
        for module in code2wav.modules():
            if isinstance(module, torch.nn.Embedding):
                module.weight.normal_(0.0, 1.0, generator=generator)
            elif isinstance(module, torch.nn.Linear | torch.nn.Conv1d | torch.nn.ConvTranspose1d):
                fan_in = module.weight[0].numel()
                if isinstance(module, torch.nn.ConvTranspose1d):
                    fan_in = module.weight.shape[0] * module.weight.shape[2] // module.stride[0]
                module.weight.normal_(0.0, 0.8 / fan_in**0.5, generator=generator)
                if module.bias is not None:
                    module.bias.zero_()
        probe = torch.randint(0, code2wav.config.codebook_size, (1, 16, 24), generator=generator)
        std = code2wav(probe).std()
        last = code2wav.decoder[-1].conv
        last.weight.mul_(wave_std / max(float(std), 1e-12))


def processor_sections() -> dict[str, Any]:
    """Qwen2.5-Omni's processor sections with Qwen3-Omni's vision patch (16)."""
    sections = processor_config()
    sections["processor_class"] = "Qwen3OmniMoeProcessor"
    for key in ("image_processor", "video_processor"):
        sections[key] = {**sections[key], "patch_size": 16}
    return sections


def build_checkpoint(path: Path, size: str = "tiny") -> None:
    """Write a complete Qwen3-Omni model directory at `path` (deterministic for a given size)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    model = Qwen3OmniMoeForConditionalGeneration(build_config(size)).eval()
    initialise(model, torch.Generator().manual_seed(SEED + 1))
    model.save_pretrained(path)
    if size == "peer":
        keep_vision_fields(path / "config.json")
    tokenizer = build_tokenizer(ADDED_TOKENS, EXTRA_SPECIAL_TOKENS, CHAT_TEMPLATE)
    tokenizer.save_pretrained(path)
    (path / "processor_config.json").write_text(json.dumps(processor_sections(), indent=2))
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    logger.info("built Qwen3-Omni (%s) at %s", size, path)


def keep_vision_fields(config_file: Path) -> None:
    """The released vision fields transformers 5 drops on save and vLLM's vision tower reads at
    construction (`image_size`, `apply_vit_abs_pos_embed`), written back."""
    config = json.loads(config_file.read_text())
    config["thinker_config"]["vision_config"].update(image_size=768, apply_vit_abs_pos_embed=True)
    config_file.write_text(json.dumps(config, indent=2))


def qwen3_omni_dir(size: str = "tiny") -> Path:
    """The cached checkpoint directory of the given size (built on first use)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return cached_dir(f"qwen3_omni-{size}", VERSION, lambda p: build_checkpoint(p, size))
