"""A tiny FLUX.2 Klein checkpoint built with diffusers' and transformers' own classes (random weights; a Qwen3
text encoder deep enough for the layers the pipeline reads, a local Qwen tokenizer with a Qwen3-style chat
template), saved as `from_pretrained` reads it."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.cache import cached_dir
from omnistage.families.shared import tokenizer_builders as toks
from omnistage.families.z_image.tiny import CHAT_TEMPLATE

VERSION = "v1"
TEXT_HIDDEN = 16
TEXT_LAYERS = 27  # the pipeline stacks hidden states 9, 18 and 27


def build_flux2_klein(path: Path) -> None:
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(12)
    transformer = Flux2Transformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=3 * TEXT_HIDDEN,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=False,
    )
    vae = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 3,
        up_block_types=("UpDecoderBlock2D",) * 3,
        block_out_channels=(8, 8, 8),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=False,
    )
    with torch.no_grad():  # a batch norm with statistics, as a trained VAE has
        vae.bn.running_mean.normal_(0, 0.1)
        vae.bn.running_var.uniform_(0.5, 1.5)
    text_encoder = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=151936,
            hidden_size=TEXT_HIDDEN,
            intermediate_size=32,
            num_hidden_layers=TEXT_LAYERS,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            max_position_embeddings=512,
        )
    ).eval()
    tokenizer = toks.qwen2_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True
        ),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )
    pipe.save_pretrained(path)


def tiny_flux2_klein_dir() -> Path:
    return cached_dir("tiny-flux2-klein", VERSION, build_flux2_klein)
