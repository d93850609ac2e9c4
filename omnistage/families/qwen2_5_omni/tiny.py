"""Tiny Qwen2.5-Omni checkpoints with the real layout, built locally from random weights.

The directory looks like a real release: one `config.json` (`Qwen2_5OmniForConditionalGeneration`), weights
under the `thinker.` / `talker.` / `token2wav.` prefixes, a `spk_dict.pt` speaker dictionary, the tokenizer
files and one nested `processor_config.json`. Only the widths and depths shrink: the thinker vocabulary keeps
its real size (152064) so every special id (`<|IMAGE|>` 151655, the talker's text ids 1518xx, the speakers'
bos ids) means what it means in the real model.

Two sizes: `tiny` for tests (a request takes well under a second) and `bench`, deep and wide enough that
batching and streaming matter, for `benchmarks/omni_pipeline.py`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from omnistage.cache import cached_dir

logger = logging.getLogger(__name__)

VERSION = "2"
SEED = 0
REGULAR_VOCAB = 151643  # Qwen2's byte-level BPE entries; added tokens start right after.

# The added tokens of the real Qwen2.5-Omni tokenizer, in id order from 151643.
ADDED_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|AUDIO|>",
    "<|audio_bos|>",
    "<|audio_eos|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_bos|>",
    "<|vision_eos|>",
    "<|vision_pad|>",
    "<|IMAGE|>",
    "<|VIDEO|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
# Whole-word tokens the chat template relies on, at their real Qwen2 ids.
WORD_IDS = {"user": 872, "system": 8948, "assistant": 77091}
SPEAKER_BOS = {"Chelsie": 151870, "Ethan": 151871}

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif part['type'] == 'audio' or 'audio' in part or 'audio_url' in part %}"
    "<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif part['type'] == 'video' or 'video' in part %}"
    "<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Widths and depths per size; everything else (ids, vocabularies, strides) is the real model's.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "text": {"hidden": 64, "ffn": 128, "layers": 2, "heads": 4, "kv_heads": 2},
        "vision": {"hidden": 32, "ffn": 64, "depth": 2, "heads": 2, "fullatt": [1]},
        "audio": {"d_model": 32, "ffn": 64, "layers": 2, "heads": 2},
        "talker": {"hidden": 32, "ffn": 64, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 16},
        "dit": {"hidden": 32, "layers": 2, "heads": 2, "head_dim": 16, "ahead": [1], "back": [0], "enc": 32},
        "bigvgan": {"channels": 128, "kernels": [3], "dilations": [[1, 3, 5]]},
    },
    # Several times the tiny sizes, small enough for a 2-core benchmark. As in the real model per second of
    # speech, code2wav (36 DiT evaluations per code, with guidance) costs the most, then the talker.
    "bench": {
        "text": {"hidden": 256, "ffn": 768, "layers": 4, "heads": 4, "kv_heads": 2},
        "vision": {"hidden": 64, "ffn": 128, "depth": 2, "heads": 4, "fullatt": [1]},
        "audio": {"d_model": 64, "ffn": 128, "layers": 2, "heads": 4},
        "talker": {"hidden": 256, "ffn": 768, "layers": 4, "heads": 4, "kv_heads": 2, "head_dim": 64},
        "dit": {
            "hidden": 64,
            "layers": 4,
            "heads": 4,
            "head_dim": 16,
            "ahead": [2],
            "back": [0, 3],
            "enc": 32,
        },
        "bigvgan": {"channels": 64, "kernels": [3], "dilations": [[1, 3, 5]]},
    },
}


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte → printable character table, in the order that gives Qwen2's ids 0..255."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    rest = [b for b in range(256) if b not in printable]
    chars = [chr(b) for b in printable] + [chr(256 + i) for i in range(len(rest))]
    return chars


# The multimodal placeholders the Qwen2.5-Omni processor reads from its tokenizer.
EXTRA_SPECIAL_TOKENS = {
    "image_token": "<|IMAGE|>",
    "audio_token": "<|AUDIO|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
}


def build_tokenizer(
    added_tokens: tuple[str, ...] = ADDED_TOKENS,
    extra_special_tokens: dict[str, str] | None = None,
    chat_template: str = CHAT_TEMPLATE,
) -> Any:
    """A Qwen2 byte-level BPE with the real layout: 256 byte tokens at ids 0..255, merges that produce the
    chat-template words at their real ids, fillers elsewhere, then the added tokens from 151643 (the
    Qwen-Omni families share this layout and differ only in their added tokens)."""
    from tokenizers import AddedToken
    from transformers.models.qwen2 import Qwen2Tokenizer

    vocab = {ch: i for i, ch in enumerate(_bytes_to_unicode())}
    merges: list[tuple[str, str]] = []
    free = iter(i for i in range(256, REGULAR_VOCAB) if i not in WORD_IDS.values())
    for word, word_id in WORD_IDS.items():
        prefix = word[0]
        for ch in word[1:]:
            merged = prefix + ch
            if merged not in vocab:
                vocab[merged] = word_id if merged == word else next(free)
            merges.append((prefix, ch))
            prefix = merged
    used = set(vocab.values())
    for i in range(256, REGULAR_VOCAB):
        if i not in used:
            vocab[f"Ġt{i}"] = i
    # In the vocabulary at their ids, so registering them as special tokens below keeps those ids.
    vocab.update({token: REGULAR_VOCAB + i for i, token in enumerate(added_tokens)})
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=32768,
        extra_special_tokens=extra_special_tokens or EXTRA_SPECIAL_TOKENS,
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in added_tokens], special_tokens=True
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def build_config(size: str = "tiny") -> Any:
    from transformers import Qwen2_5OmniConfig

    s = SIZES[size]
    text, vision, audio, talker, dit, vgan = (
        s[k] for k in ("text", "vision", "audio", "talker", "dit", "bigvgan")
    )
    rope = {
        "rope_type": "default",
        "rope_theta": 1e6,
        "mrope_section": _mrope_for(text["hidden"] // text["heads"]),
    }
    thinker = {
        "text_config": {
            "vocab_size": 152064,
            "hidden_size": text["hidden"],
            "intermediate_size": text["ffn"],
            "num_hidden_layers": text["layers"],
            "num_attention_heads": text["heads"],
            "num_key_value_heads": text["kv_heads"],
            "rope_parameters": rope,
            "max_position_embeddings": 32768,
            "eos_token_id": 151645,
            "pad_token_id": 151643,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "depth": vision["depth"],
            "hidden_size": vision["hidden"],
            "intermediate_size": vision["ffn"],
            "num_heads": vision["heads"],
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": vision["fullatt"],
            "out_hidden_size": text["hidden"],
        },
        "audio_config": {
            "num_mel_bins": 128,
            "encoder_layers": audio["layers"],
            "encoder_attention_heads": audio["heads"],
            "encoder_ffn_dim": audio["ffn"],
            "d_model": audio["d_model"],
            "n_window": 100,
            "output_dim": text["hidden"],
        },
        "vision_start_token_id": 151652,
        "vision_end_token_id": 151653,
        "vision_token_id": 151654,
        "tie_word_embeddings": False,
    }
    talker_cfg = {
        "vocab_size": 8448,
        "embedding_size": text["hidden"],
        "hidden_size": talker["hidden"],
        "intermediate_size": talker["ffn"],
        "num_hidden_layers": talker["layers"],
        "num_attention_heads": talker["heads"],
        "num_key_value_heads": talker["kv_heads"],
        "head_dim": talker["head_dim"],
        "rope_parameters": {**rope, "mrope_section": _mrope_for(talker["head_dim"])},
        "spatial_merge_size": 2,
    }
    token2wav = {
        "dit_config": {
            "hidden_size": dit["hidden"],
            "num_hidden_layers": dit["layers"],
            "num_attention_heads": dit["heads"],
            "head_dim": dit["head_dim"],
            "ff_mult": 2,
            "emb_dim": 16,
            "block_size": 24,
            "look_ahead_layers": dit["ahead"],
            "look_backward_layers": dit["back"],
            "repeats": 2,
            "mel_dim": 80,
            # A random talker can emit any code below its 8448-entry vocabulary; the real table (8193)
            # would raise IndexError on them.
            "num_embeds": 8448,
            "enc_emb_dim": 16,
            "enc_dim": 16,
            "enc_channels": [dit["enc"]] * 4 + [3 * dit["enc"]],
            "enc_kernel_sizes": [5, 3, 3, 3, 1],
            "enc_dilations": [1, 2, 3, 4, 1],
            "enc_attention_channels": 16,
            "enc_se_channels": 16,
        },
        "bigvgan_config": {
            "mel_dim": 80,
            "upsample_initial_channel": vgan["channels"],
            "resblock_kernel_sizes": vgan["kernels"],
            "resblock_dilation_sizes": vgan["dilations"],
            "upsample_rates": [5, 3, 2, 2, 2, 2],
            "upsample_kernel_sizes": [11, 7, 4, 4, 4, 4],
        },
    }
    config = Qwen2_5OmniConfig(thinker_config=thinker, talker_config=talker_cfg, token2wav_config=token2wav)
    config.architectures = ["Qwen2_5OmniForConditionalGeneration"]
    return config


def _mrope_for(head_dim: int) -> list[int]:
    """Multimodal RoPE sections (temporal, height, width) summing to head_dim / 2, in the real 2:3:3 ratio."""
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def build_speakers(config: Any, generator: torch.Generator) -> dict[str, dict[str, Any]]:
    """Speaker conditioning in the real `spk_dict.pt` format: an x-vector (`cond`), a reference mel
    spectrogram (`ref_mel`) and the thinker token that opens the talker's text stream (`bos_token`)."""
    dit = config.token2wav_config.dit_config
    speakers = {}
    for name, bos in SPEAKER_BOS.items():
        speakers[name] = {
            "cond": torch.randn(1, dit.enc_emb_dim, generator=generator),
            "ref_mel": torch.randn(1, 32, dit.mel_dim, generator=generator) * 0.5 - 4.0,
            "bos_token": bos,
        }
    return speakers


def processor_config() -> dict[str, Any]:
    """The nested `processor_config.json` transformers 5 writes for Qwen2_5OmniProcessor (real values, except
    a 30 s audio window instead of 300 s: padding every clip to 300 s costs ~0.3 s of CPU per request)."""
    return {
        "processor_class": "Qwen2_5OmniProcessor",
        "feature_extractor": {
            "feature_extractor_type": "WhisperFeatureExtractor",
            "feature_size": 128,
            "sampling_rate": 16000,
            "hop_length": 160,
            "chunk_length": 30,
            "n_fft": 400,
            "padding_side": "right",
            "padding_value": 0.0,
            "return_attention_mask": True,
        },
        "image_processor": {
            "image_processor_type": "Qwen2VLImageProcessor",
            "min_pixels": 3136,
            "max_pixels": 12845056,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "do_resize": True,
            "do_convert_rgb": True,
        },
        "video_processor": {
            "video_processor_type": "Qwen2VLVideoProcessor",
            "min_pixels": 3136,
            "max_pixels": 12845056,
            "patch_size": 14,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "image_mean": [0.48145466, 0.4578275, 0.40821073],
            "image_std": [0.26862954, 0.26130258, 0.27577711],
        },
    }


def make_audible(token2wav: torch.nn.Module, wave_std: float = 0.2) -> None:
    """Re-initialise token2wav so its output means something.

    With transformers' N(0, 0.02) init the DiT barely moves its initial noise (codes hardly matter) and the
    vocoder's ~20 layers shrink the waveform to ~1e-7, which would make any waveform comparison pass. Here
    the DiT gets unit-gain layers and unit-variance code embeddings (its velocity is O(1) and depends on the
    codes and, through block attention, on neighbouring blocks), and the vocoder gets slightly contractive
    layers with its last convolution scaled so a random mel gives a waveform of std `wave_std`.
    """
    dit, vocoder = token2wav.code2wav_dit_model, token2wav.code2wav_bigvgan_model
    with torch.no_grad():
        for module, gain in [(m, 1.0) for m in dit.modules()] + [(m, 0.6) for m in vocoder.modules()]:
            if isinstance(module, torch.nn.Embedding):
                module.weight.normal_(0.0, 1.0)
            elif isinstance(module, torch.nn.Linear | torch.nn.Conv1d | torch.nn.ConvTranspose1d):
                fan_in = module.weight[0].numel()
                if isinstance(module, torch.nn.ConvTranspose1d):
                    fan_in = module.weight.shape[0] * module.weight.shape[2] // module.stride[0]
                module.weight.normal_(0.0, gain / fan_in**0.5)
                if module.bias is not None:
                    module.bias.zero_()
        probe = torch.randn(1, vocoder.config.mel_dim, 64) - 2.0
        std = vocoder(probe).std()
        vocoder.conv_post.weight.mul_(wave_std / std)


def build_checkpoint(path: Path, size: str = "tiny") -> None:
    """Write a complete Qwen2.5-Omni model directory at `path` (deterministic for a given size)."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(SEED)
    config = build_config(size)
    model = Qwen2_5OmniForConditionalGeneration(config).eval()
    make_audible(model.token2wav)
    model.save_pretrained(path)
    generator = torch.Generator().manual_seed(SEED + 1)
    torch.save(build_speakers(config, generator), path / "spk_dict.pt")
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(path)
    (path / "processor_config.json").write_text(json.dumps(processor_config(), indent=2))
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    logger.info("built Qwen2.5-Omni (%s) at %s", size, path)


def qwen2_5_omni_dir(size: str = "tiny") -> Path:
    """The cached checkpoint directory of the given size (built on first use)."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return cached_dir(f"qwen2_5_omni-{size}", VERSION, lambda p: build_checkpoint(p, size))


def demo_checkpoint_dir() -> Path:
    """The model the demo server serves."""
    return qwen2_5_omni_dir("tiny")
