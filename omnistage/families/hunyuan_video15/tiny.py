"""A tiny HunyuanVideo-1.5 text-to-video checkpoint built with diffusers' and transformers' own classes
(random weights; a Qwen2.5-VL text model and a ByT5 glyph encoder, a local Qwen tokenizer with a chat
template), saved as `from_pretrained` reads it."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.cache import cached_dir
from omnistage.families.shared import tokenizer_builders as toks
from omnistage.families.z_image.tiny import CHAT_TEMPLATE

VERSION = "v1"
LATENT_CHANNELS = 4
TEXT_HIDDEN = 16


def build_hunyuan_video15(path: Path, image_to_video: bool = False) -> None:
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    torch.manual_seed(14)
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=2 * LATENT_CHANNELS + 1,  # the latents, the condition latents and their mask
        out_channels=LATENT_CHANNELS,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        num_refiner_layers=1,
        text_embed_dim=TEXT_HIDDEN,
        text_embed_2_dim=16,
        image_embed_dim=16,
        rope_axes_dim=(2, 2, 4),
        target_size=32,
        task_type="i2v" if image_to_video else "t2v",
    )
    vae = AutoencoderKLHunyuanVideo15(
        latent_channels=LATENT_CHANNELS,
        block_out_channels=(8, 8, 8),
        layers_per_block=1,
        spatial_compression_ratio=4,
        temporal_compression_ratio=4,
    )
    text_encoder = Qwen2_5_VLTextModel(
        Qwen2_5_VLTextConfig(
            vocab_size=151936,
            hidden_size=TEXT_HIDDEN,
            intermediate_size=32,
            num_hidden_layers=3,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=2048,
            rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 1000000.0},
        )
    ).eval()
    glyph_encoder = T5EncoderModel(
        T5Config(
            vocab_size=384, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0
        )
    ).eval()
    tokenizer = toks.qwen2_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    components = {
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "transformer": transformer,
        "vae": vae,
        "scheduler": FlowMatchEulerDiscreteScheduler(shift=7.0),
        "text_encoder_2": glyph_encoder,
        "tokenizer_2": ByT5Tokenizer(),
        "guider": ClassifierFreeGuidance(guidance_scale=6.0),
    }
    if not image_to_video:
        HunyuanVideo15Pipeline(**components).save_pretrained(path)
        return
    from diffusers import HunyuanVideo15ImageToVideoPipeline
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    vision = SiglipVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
    )
    pipe = HunyuanVideo15ImageToVideoPipeline(
        **components,
        image_encoder=SiglipVisionModel(vision).eval(),
        feature_extractor=SiglipImageProcessor(size={"height": 32, "width": 32}),
    )
    pipe.save_pretrained(path)


def tiny_hunyuan_video15_dir(image_to_video: bool = False) -> Path:
    if image_to_video:
        return cached_dir("tiny-hunyuan-video15-i2v", VERSION, lambda p: build_hunyuan_video15(p, True))
    return cached_dir("tiny-hunyuan-video15", VERSION, build_hunyuan_video15)
