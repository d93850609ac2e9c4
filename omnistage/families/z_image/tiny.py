"""A tiny Z-Image checkpoint built with diffusers' and transformers' own classes (random weights, a local
Qwen tokenizer with a Qwen3-style chat template), saved as `from_pretrained` reads it."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.cache import cached_dir
from omnistage.families.diffusers.tiny import image_vae
from omnistage.families.shared import tokenizer_builders as toks

VERSION = "v1"
# Qwen3's chat template in short: the pipeline renders each prompt as a user turn, thinking enabled.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def build_z_image(path: Path) -> None:
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        ZImagePipeline,
        ZImageTransformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(11)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=4,
        dim=32,
        n_layers=2,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        cap_feat_dim=16,
        axes_dims=[8, 4, 4],
        axes_lens=[256, 32, 32],
    )
    text_encoder = Qwen3Model(
        Qwen3Config(
            vocab_size=151936,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            max_position_embeddings=512,
        )
    ).eval()
    vae = image_vae(4, scaling_factor=0.3611, shift_factor=0.1159)
    tokenizer = toks.qwen2_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False
    )
    pipe = ZImagePipeline(
        scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer
    )
    pipe.save_pretrained(path)


def tiny_z_image_dir() -> Path:
    return cached_dir("tiny-z-image", VERSION, build_z_image)
