"""Janus-Pro checkpoints with random weights, built with transformers' own classes
(`JanusForConditionalGeneration`: a Llama LM, its SigLIP-style vision encoder, the VQ-VAE that renders image
tokens, the generation head and embeddings) and saved as `from_pretrained` reads them, with a local tokenizer
carrying Janus' image markers and the image processor's config beside them.

`tiny_janus_dir()`: tests (a 2-layer, 64-wide LM; 32x32 images of 16 tokens from a 64-entry codebook).
`bench_janus_dir(dtype)`: the benchmark's (`BENCH`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omnistage.cache import cached_dir

MARKERS = (
    "<|endoftext|>",
    "<|begin_of_sentence|>",
    "<begin_of_image>",
    "<end_of_image>",
    "<image_placeholder>",
    "<pad>",
)

# Janus-Pro's turn layout (image parts as the placeholder the processor expands), written locally: the
# checkpoint's own template lives on the model hub.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message.role == 'user' %}<|User|>: {% else %}<|Assistant|>: {% endif %}"
    "{% for part in message.content %}{% if part.type == 'image' %}<image_placeholder>\n"
    "{% elif part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}\n\n{% endfor %}"
    "{% if add_generation_prompt %}<|Assistant|>:{% endif %}"
)

TINY = dict(
    text=dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
    ),
    vision=dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=32, patch_size=8, depth=1
    ),
    vq=dict(
        embed_dim=8,
        num_embeddings=64,
        latent_channels=16,
        base_channels=32,  # its GroupNorm's 32 groups
        channel_multiplier=[1, 1, 2, 2],
        num_res_blocks=1,
        num_patches=4,
        num_hidden_layers=1,
    ),
    specials=dict(zip(MARKERS, range(600, 606), strict=True)),
)
# Janus-Pro-1B's LM widths (2048, 24 layers → a quarter, 6) and its image path (384x384, 576 tokens of a
# 16384-entry codebook, the VQ decoder at a quarter of its base width), sized for two cores.
BENCH = dict(
    text=dict(
        hidden_size=2048,
        num_hidden_layers=6,
        num_attention_heads=16,
        num_key_value_heads=16,
        intermediate_size=5632,
    ),
    vision=dict(
        hidden_size=256, num_hidden_layers=2, num_attention_heads=4, image_size=384, patch_size=16, depth=2
    ),
    vq=dict(base_channels=32, num_patches=24),
    specials=dict(zip(MARKERS, range(100000, 100006), strict=True)),
)


def build(path: Path, spec: dict[str, Any], dtype: str = "float32") -> None:
    """Write a random-weight Janus checkpoint into `path`."""
    import torch
    from transformers import JanusConfig, JanusForConditionalGeneration, JanusImageProcessor, JanusProcessor

    from omnistage.families.shared.tokenizer_builders import qwen2_tokenizer

    specials = spec["specials"]
    tokenizer = qwen2_tokenizer(specials)
    tokenizer._set_model_specific_special_tokens(  # saved with it: the processor reads them by name
        {"image_token": "<image_placeholder>", "boi_token": "<begin_of_image>", "eoi_token": "<end_of_image>"}
    )
    size = spec["vision"]["image_size"]
    image_processor = JanusImageProcessor(size={"height": size, "width": size})
    width = spec["text"]["hidden_size"]
    tokens = (size // spec["vision"]["patch_size"]) ** 2
    processor = JanusProcessor(
        image_processor, tokenizer, chat_template=CHAT_TEMPLATE, num_image_tokens=tokens
    )
    processor.save_pretrained(str(path))
    config = JanusConfig(
        text_config=dict(
            model_type="llama", vocab_size=len(tokenizer), max_position_embeddings=4096, **spec["text"]
        ),
        vision_config=dict(projection_dim=width, num_image_tokens=tokens, **spec["vision"]),
        vq_config=dict(projection_dim=width, image_token_embed_dim=width, **spec["vq"]),
        image_token_id=specials["<image_placeholder>"],
    )
    torch.manual_seed(0)
    model = JanusForConditionalGeneration(config).eval()
    if spec is TINY:
        with torch.no_grad():  # fed-back tokens and images that move the state: greedy outputs that vary
            model.model.generation_embeddings.weight *= 100.0
            for weight in model.model.language_model.layers.parameters():
                if weight.dim() == 2:
                    weight *= 10.0
    gen = model.generation_config
    gen.bos_token_id = specials["<|begin_of_sentence|>"]
    gen.eos_token_id = specials["<|endoftext|>"]
    gen.pad_token_id = specials["<pad>"]
    gen.generation_kwargs = {"boi_token_id": specials["<begin_of_image>"]}
    gen.guidance_scale = 5.0
    model.to(getattr(torch, dtype)).save_pretrained(str(path))
    (path / "omnistage.json").write_text(json.dumps({"family": "janus", "dtype": dtype}))


def _version(extra: str) -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + extra.encode()).hexdigest()[:12]


def tiny_janus_dir() -> Path:
    return cached_dir("tiny-janus", _version("tiny"), lambda path: build(path, TINY))


def bench_janus_dir(dtype: str = "float32") -> Path:
    return cached_dir(f"bench-janus-{dtype}", _version(dtype), lambda path: build(path, BENCH, dtype))
