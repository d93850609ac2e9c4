"""VoxCPM2 checkpoints with random weights, built with the reference package's own classes (`voxcpm`:
`VoxCPM2Model` with its `AudioVAEV2`) and saved as its `from_local` reads them (`config.json`,
`model.safetensors`, `audiovae.safetensors`, the tokenizer files), so serving and the reference load the same
directory through the real loading code. The tokenizer is a local byte-level BPE loaded as the released
one is (`LlamaTokenizerFast`), with VoxCPM's four audio markers at their hard-coded ids 101–104.

`tiny_voxcpm2_dir()`: tests (a 2-layer, 64-wide base LM, 1 residual layer, patches of 2 latents of 16, a
small causal VAE at 16 kHz in, 16 kHz out). `bench_voxcpm2_dir(dtype)`: the benchmark's (`BENCH`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omnistage.cache import cached_dir

# The reference's hard-coded audio markers (voxcpm2.py) and the other specials, at fixed ids.
SPECIALS = {
    "<unk>": 0,
    "<s>": 1,
    "</s>": 2,
    "<|audio_start|>": 101,
    "<|audio_end|>": 102,
    "<|ref_audio_start|>": 103,
    "<|ref_audio_end|>": 104,
}


def _lm(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int) -> dict[str, Any]:
    head_dim = hidden // heads
    return dict(
        bos_token_id=1,
        eos_token_id=2,
        hidden_size=hidden,
        intermediate_size=ffn,
        max_position_embeddings=4096,
        num_attention_heads=heads,
        num_hidden_layers=layers,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5,
        rope_scaling=dict(
            type="longrope",
            long_factor=[1.0 + i / head_dim for i in range(head_dim // 2)],
            short_factor=[1.0 + i / (2 * head_dim) for i in range(head_dim // 2)],
            original_max_position_embeddings=4096,
        ),
        vocab_size=vocab,
        use_mup=True,
        scale_emb=12,
        dim_model_base=256,
        scale_depth=1.4,
        rope_theta=10000.0,
    )


TINY = dict(
    lm_config=_lm(2, 64, 4, 2, 128, 0),  # vocab_size set from the tokenizer
    patch_size=2,
    feat_dim=16,
    residual_lm_num_layers=1,
    scalar_quantization_latent_dim=16,
    scalar_quantization_scale=9,
    encoder_config=dict(hidden_dim=32, ffn_dim=64, num_heads=2, num_layers=1),
    dit_config=dict(hidden_dim=32, ffn_dim=64, num_heads=2, num_layers=2, cfm_config={}),
    audio_vae_config=dict(
        encoder_dim=8,
        encoder_rates=[2, 4, 5],
        latent_dim=16,
        decoder_dim=32,
        decoder_rates=[5, 4, 2],
        sample_rate=16000,
        out_sample_rate=16000,
        cond_dim=8,
    ),
    max_length=4096,
    dtype="float32",
)
# The benchmark's: `VoxCPMConfig`'s defaults where it has them (patches of 4 latents of 64, FSQ 512, a
# 1024-wide local encoder and DiT with 16 heads, 8 residual LM layers, 4 encoder and DiT layers) under a
# 2048-wide MiniCPM-4 base LM (heads of 64, as the local modules' shared RoPE needs), a quarter of every
# stack's layers (7 base, 2 residual, 1 encoder, 1 DiT), and the released VAE's architecture (16 kHz in,
# 48 kHz out).
BENCH = dict(
    lm_config=_lm(7, 2048, 32, 2, 6144, 0),
    patch_size=4,
    feat_dim=64,
    residual_lm_num_layers=2,
    scalar_quantization_latent_dim=512,
    scalar_quantization_scale=9,
    encoder_config=dict(hidden_dim=1024, ffn_dim=4096, num_heads=16, num_layers=1),
    dit_config=dict(hidden_dim=1024, ffn_dim=4096, num_heads=16, num_layers=1, cfm_config={}),
    audio_vae_config=None,  # the released VAE's (AudioVAEConfigV2's defaults)
    max_length=4096,
    dtype="float32",
)


def _tokenizer() -> Any:
    """A byte-level BPE with the specials at their ids (fillers between), learned from the shared corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaTokenizerFast

    from omnistage.families.shared.tokenizer_builders import BYTE_ALPHABET, _learn_bpe, _words

    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    merges = _learn_bpe(_words(split.pre_tokenize_str), 300)
    vocab: dict[str, int] = {}
    for token, token_id in sorted(SPECIALS.items(), key=lambda kv: kv[1]):
        while len(vocab) < token_id:
            vocab[f"<|reserved_{len(vocab)}|>"] = len(vocab)
        vocab[token] = token_id
    for symbol in [*BYTE_ALPHABET, *(a + b for a, b in merges)]:
        vocab.setdefault(symbol, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    backend.pre_tokenizer = split
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIALS))
    return LlamaTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>", add_bos_token=False
    )


def build(path: Path, overrides: dict[str, Any], dtype: str = "float32") -> None:
    """Write a random-weight VoxCPM2 checkpoint into `path`, as `VoxCPM2Model.from_local` reads it."""
    import torch
    from safetensors.torch import save_file
    from voxcpm.model.voxcpm2 import VoxCPM2Model, VoxCPMConfig
    from voxcpm.modules.audiovae import AudioVAEConfigV2, AudioVAEV2

    tokenizer = _tokenizer()
    tokenizer.save_pretrained(str(path))
    raw = json.loads(json.dumps(overrides))
    raw["lm_config"]["vocab_size"] = len(tokenizer)
    raw["dtype"] = dtype
    raw["device"] = "cpu"
    if raw.get("audio_vae_config") is None:
        raw.pop("audio_vae_config", None)
    config = VoxCPMConfig.model_validate(raw)
    torch.manual_seed(0)
    vae_config = AudioVAEConfigV2(**raw["audio_vae_config"]) if "audio_vae_config" in raw else None
    vae = AudioVAEV2(config=vae_config) if vae_config else AudioVAEV2()
    from transformers import LlamaTokenizerFast

    model = VoxCPM2Model(config, LlamaTokenizerFast.from_pretrained(str(path)), vae, device="cpu").eval()
    with torch.no_grad():
        if overrides is TINY:
            # the stop head's "go on" row lowered, so tiny prompts stop on their own after 18-33 patches
            model.stop_head.weight[0] -= 0.09
        else:
            # "stop" far below "go on": a bench request speaks its whole length cap, on both sides alike
            model.stop_head.weight[1] = model.stop_head.weight[0] - 1.0
    (path / "config.json").write_text(config.model_dump_json(indent=1, exclude_none=True))
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not k.startswith("audio_vae.")}
    state = {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in state.items()}
    save_file(state, str(path / "model.safetensors"))
    save_file({k: v.contiguous() for k, v in vae.state_dict().items()}, str(path / "audiovae.safetensors"))
    (path / "omnistage.json").write_text(json.dumps({"family": "voxcpm2", "dtype": dtype}))


def _version(extra: str) -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + extra.encode()).hexdigest()[:12]


def tiny_voxcpm2_dir() -> Path:
    return cached_dir("tiny-voxcpm2", _version("tiny"), lambda path: build(path, TINY))


def bench_voxcpm2_dir(dtype: str = "float32") -> Path:
    return cached_dir(f"bench-voxcpm2-{dtype}", _version(dtype), lambda path: build(path, BENCH, dtype))
