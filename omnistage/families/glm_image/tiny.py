"""GLM-Image checkpoints with random weights, built with the reference's own classes and saved as
`GlmImagePipeline.from_pretrained` reads them: transformers' `GlmImageForConditionalGeneration` (the AR
model that writes image tokens) with its `GlmImageProcessor` (a local tokenizer carrying the image, grid and
image-start markers, and a GLM-style chat template), diffusers' `GlmImageTransformer2DModel` (the DiT),
`AutoencoderKL`, a T5 glyph encoder with the byte-level `ByT5Tokenizer`, and the flow-matching scheduler.

The AR head covers more ids than the VQ codebook (as the real model's 16512 over 16384); the reference
samples them only if left unsuppressed, so the checkpoint's generation config suppresses them and samples
top-1 (`generate` then picks what greedy decoding would: the tests compare tokens exactly).

`tiny_glm_image_dir()`: tests (a 2-layer, 64-wide AR model, a 64-entry codebook, a 2-layer DiT; 32x32
images: 256 preview tokens and 1 target token). `bench_glm_image_dir()`: the benchmark's (`BENCH`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omnistage.cache import cached_dir

# The tokenizer's markers: the image placeholder, the grid brackets and the image-start marker (its BOS)
# and end marker, at ids past the byte-level vocabulary.
MARKERS = ("<|endoftext|>", "<|image|>", "<sop>", "<eop>", "<|begin_of_image|>", "<|end_of_image|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message.role }}|>\n"
    "{% for part in message.content %}{% if part.type == 'text' %}{{ part.text }}"
    "{% else %}<|begin_of_image|><|image|><|end_of_image|>{% endif %}{% endfor %}{% endfor %}"
)

TINY = dict(
    text=dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    ),
    # source images (to edit) halved by the image processor, then a token per 16 pixels: a token per 32 of
    # the source, as the AR writes its target (upsampled 2x: the DiT's grid, its VAE's 8 x its patch 2)
    vision=dict(depth=1, hidden_size=32, num_heads=2, image_size=32, patch_size=16, intermediate_size=32),
    pixels=dict(patch_size=16, merge_size=1, temporal_patch_size=1, min_pixels=32 * 32, max_pixels=128 * 128),
    codebook=64,
    vision_vocab=72,
    dit=dict(num_layers=2, attention_head_dim=8, num_attention_heads=2, time_embed_dim=16, condition_dim=8),
    vae=dict(block_out_channels=(4, 8, 16, 16), norm_num_groups=4, latent_channels=4),
    t5=dict(d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4),
    sample_size=4,  # the pipeline's default image: 4 latent cells x 8 = 32 pixels a side
    specials=dict(zip(MARKERS, range(600, 606), strict=True)),
)
# GLM-Image's AR widths at a tenth of its depth (4096 wide, 40 layers → 4) and a DiT of 4 of its 30 layers
# (64 heads of 40 → 16), with the real codebook, sized for two cores; 256x256 images (64 target + 256
# preview tokens).
BENCH = dict(
    text=dict(
        hidden_size=2048,
        intermediate_size=6848,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=2,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,  # as GLM-Image: half of each 128-wide head rotates
            "mrope_section": [8, 12, 12],
        },
    ),
    vision=dict(depth=1, hidden_size=64, num_heads=2, image_size=256, patch_size=16, intermediate_size=64),
    pixels=dict(
        patch_size=16, merge_size=1, temporal_patch_size=1, min_pixels=128 * 128, max_pixels=512 * 512
    ),
    codebook=16384,
    vision_vocab=16512,
    dit=dict(
        num_layers=4, attention_head_dim=40, num_attention_heads=16, time_embed_dim=512, condition_dim=256
    ),
    vae=dict(block_out_channels=(32, 64, 64, 64), norm_num_groups=32, latent_channels=16),
    t5=dict(d_model=256, d_kv=32, d_ff=512, num_layers=2, num_heads=8),
    sample_size=32,
    specials=dict(zip(MARKERS, range(20000, 20006), strict=True)),
)


def build(path: Path, spec: dict[str, Any], dtype: str = "float32") -> None:
    """Write a random-weight GLM-Image pipeline directory into `path`."""
    import torch
    from diffusers import (
        AutoencoderKL,
        FlowMatchEulerDiscreteScheduler,
        GlmImagePipeline,
        GlmImageTransformer2DModel,
    )
    from transformers import (
        ByT5Tokenizer,
        GlmImageConfig,
        GlmImageForConditionalGeneration,
        GlmImageImageProcessorPil,
        GlmImageProcessor,
        T5Config,
        T5EncoderModel,
    )

    from omnistage.families.shared.tokenizer_builders import qwen2_tokenizer

    specials = spec["specials"]
    tokenizer = qwen2_tokenizer(specials)
    tokenizer.bos_token = "<|begin_of_image|>"
    tokenizer._set_model_specific_special_tokens(  # saved with it: the processor reads them by name
        {"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"}
    )
    processor = GlmImageProcessor(
        image_processor=GlmImageImageProcessorPil(**spec["pixels"]),
        tokenizer=tokenizer,
        chat_template=CHAT_TEMPLATE,
    )
    codebook = spec["codebook"]
    config = GlmImageConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            vision_vocab_size=spec["vision_vocab"],
            max_position_embeddings=4096,
            pad_token_id=specials["<|endoftext|>"],
            eos_token_id=specials["<|end_of_image|>"],
            **spec["text"],
        ),
        vision_config=spec["vision"],
        vq_config=dict(embed_dim=32, num_embeddings=codebook, latent_channels=spec["vision"]["hidden_size"]),
        image_token_id=specials["<|image|>"],
        image_start_token_id=specials["<|begin_of_image|>"],
        image_end_token_id=specials["<|end_of_image|>"],
    )
    torch.manual_seed(0)
    ar = GlmImageForConditionalGeneration(config).eval()
    if spec is TINY:  # random weights that move with the fed-back tokens: greedy grids of many ids
        with torch.no_grad():
            for weight in ar.model.language_model.layers.parameters():
                if weight.dim() == 2:
                    weight *= 10.0
            ar.model.language_model.embed_tokens.weight[:codebook] *= 100.0
    gen = ar.generation_config
    gen.eos_token_id = specials["<|end_of_image|>"]
    gen.pad_token_id = specials["<|endoftext|>"]
    gen.do_sample, gen.top_k, gen.top_p, gen.temperature = True, 1, 1.0, 1.0
    gen.suppress_tokens = list(range(codebook, spec["vision_vocab"]))
    torch.manual_seed(0)
    t5 = T5EncoderModel(T5Config(vocab_size=384, **spec["t5"])).eval()
    torch.manual_seed(0)
    transformer = GlmImageTransformer2DModel(
        patch_size=2,
        in_channels=spec["vae"]["latent_channels"],
        out_channels=spec["vae"]["latent_channels"],
        text_embed_dim=spec["t5"]["d_model"],
        prior_vq_quantizer_codebook_size=codebook,
        **spec["dit"],
    )
    torch.manual_seed(0)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        latents_mean=[0.0] * spec["vae"]["latent_channels"],
        latents_std=[1.0] * spec["vae"]["latent_channels"],
        **spec["vae"],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_image_seq_len=256, base_shift=0.25, max_shift=0.75
    )
    pipe = GlmImagePipeline(
        tokenizer=ByT5Tokenizer(),
        processor=processor,
        text_encoder=t5,
        vision_language_encoder=ar,
        vae=vae,
        transformer=transformer,
        scheduler=scheduler,
    )
    pipe.to(getattr(torch, dtype)).save_pretrained(str(path))
    config_file = path / "transformer" / "config.json"  # the pipeline's default size (default_sample_size)
    dit_config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**dit_config, "sample_size": spec["sample_size"]}, indent=2))
    (path / "omnistage.json").write_text(json.dumps({"family": "glm_image", "dtype": dtype}))


def _version(extra: str) -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + extra.encode()).hexdigest()[:12]


def tiny_glm_image_dir() -> Path:
    return cached_dir("tiny-glm-image", _version("tiny"), lambda path: build(path, TINY))


def bench_glm_image_dir(dtype: str = "float32") -> Path:
    return cached_dir(f"bench-glm-image-{dtype}", _version(dtype), lambda path: build(path, BENCH, dtype))
