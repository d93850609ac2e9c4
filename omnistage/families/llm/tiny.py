"""Tiny LLM checkpoints (Qwen2, Qwen3, Llama) with random weights and a local tokenizer, saved with
`save_pretrained` so everything downstream goes through the real loading code.

`tiny_llm_dir(arch)` is what tests use; `build_demo_llm()` is a fast stand-in for the demo's trained chat
model (omnistage.demo.smollm); `bench_llm_dir()` is the benchmark's 12-layer Qwen2 in bf16.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.cache import cached_dir
from omnistage.families.shared.tokenizer import build_tokenizer, generation_eos_ids

ARCHS = {
    # arch: (config class, model class, tokenizer family)
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", "qwen"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", "qwen"),
    "llama": ("LlamaConfig", "LlamaForCausalLM", "llama"),
}

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    initializer_range=0.1,  # spread-out logits: greedy ties between implementations become vanishingly rare
)
TINY_VOCAB = 512

BENCH = dict(
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)
BENCH_VOCAB = 32000


def build_llm(
    path: Path, arch: str, overrides: dict[str, Any], vocab_size: int, dtype: str = "float32", seed: int = 0
) -> None:
    """Write a random-weight `arch` checkpoint with its tokenizer into `path`."""
    import torch
    import transformers
    from transformers import GenerationConfig

    config_cls, model_cls, family = ARCHS[arch]
    specials = build_tokenizer(path, family, vocab_size)
    eos = generation_eos_ids(family, specials)
    extra = (
        {"head_dim": overrides["hidden_size"] // overrides["num_attention_heads"]} if arch == "qwen3" else {}
    )
    config = getattr(transformers, config_cls)(
        vocab_size=vocab_size,
        bos_token_id=specials.get("<|begin_of_text|>"),
        eos_token_id=eos[-1],
        pad_token_id=eos[-1],
        **{"tie_word_embeddings": arch != "llama", **overrides, **extra},
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(getattr(torch, dtype)).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=eos, pad_token_id=eos[-1], bos_token_id=config.bos_token_id, do_sample=False
    )
    model.save_pretrained(str(path))


def tiny_llm_dir(arch: str = "qwen2") -> Path:
    """A 2-layer, 64-wide fp32 `arch` checkpoint with a 512-token vocabulary, built once per machine."""
    return cached_dir(f"tiny-{arch}", "v1", lambda p: build_llm(p, arch, TINY, TINY_VOCAB))


def build_demo_llm() -> Path:
    """A tiny Qwen2 stand-in for the demo's chat model, where a real one would be too slow."""
    return tiny_llm_dir("qwen2")


def bench_llm_dir() -> Path:
    """The AR benchmark's model: Qwen2 architecture, hidden 768, 12 layers, 12 heads, 4 KV heads, bf16."""
    return cached_dir(
        "bench-qwen2-768", "v1", lambda p: build_llm(p, "qwen2", BENCH, BENCH_VOCAB, "bfloat16")
    )
