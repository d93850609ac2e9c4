"""Tiny Qwen-Image-Edit and Qwen-Image-Edit-Plus checkpoints built with diffusers' and transformers' own
classes (random weights from a fixed seed: two builds are byte-identical; a Qwen2.5-VL text encoder with a
tiny vision tower, a local Qwen tokenizer, the image-only Qwen2-VL processor of processor.py), saved as
`from_pretrained` reads them. The two differ only in `model_index.json`'s pipeline class.

The pipelines resize every image they VAE-encode to about 1024x1024 pixels whatever the output size, so the
VAE downsamples 32x (five levels, no residual blocks): an input image is then ~256 transformer tokens and
outputs are multiples of 64 pixels. The vision processor caps its images at 56x56 pixels (a few tokens).
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.cache import cached_dir
from omnistage.families.shared import tokenizer_builders as toks

VERSION = "v1"
TEXT_HIDDEN = 16
Z_DIM = 4
LATENTS_MEAN = [-0.75, 0.1, 0.96, -0.15]
LATENTS_STD = [2.8, 1.45, 2.3, 1.2]
VISION_PIXELS = (28 * 28, 56 * 56)  # the image processor's min_pixels, max_pixels


def _text_encoder():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 151936,
            "hidden_size": TEXT_HIDDEN,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 1024,
            "rope_parameters": {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 1000000.0},
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": TEXT_HIDDEN,
            "fullatt_block_indexes": [0],
            "window_size": 28,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def _processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from omnistage.families.qwen_image_edit.processor import ImageOnlyQwen2VLProcessor

    low, high = VISION_PIXELS
    return ImageOnlyQwen2VLProcessor(
        image_processor=Qwen2VLImageProcessorPil(min_pixels=low, max_pixels=high),
        tokenizer=toks.qwen2_tokenizer(),
    )


def _build(path: Path, pipeline_class: str) -> None:
    import diffusers
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    from omnistage.families.diffusers.tiny import qwen_image_scheduler

    torch.manual_seed(7)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=4 * Z_DIM,
        out_channels=Z_DIM,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=TEXT_HIDDEN,
        guidance_embeds=False,
        axes_dims_rope=(4, 6, 6),
    )
    vae = AutoencoderKLQwenImage(
        base_dim=4,
        z_dim=Z_DIM,
        dim_mult=[1] * 6,
        num_res_blocks=0,
        temperal_downsample=[False] * 5,
        latents_mean=LATENTS_MEAN,
        latents_std=LATENTS_STD,
    )
    scheduler = qwen_image_scheduler()
    processor = _processor()
    pipe = getattr(diffusers, pipeline_class)(
        scheduler=scheduler,
        vae=vae,
        text_encoder=_text_encoder(),
        tokenizer=processor.tokenizer,
        processor=processor,
        transformer=transformer,
    )
    pipe.save_pretrained(path)


def tiny_qwen_image_edit_dir() -> Path:
    return cached_dir("tiny-qwen-image-edit", VERSION, lambda path: _build(path, "QwenImageEditPipeline"))


def tiny_qwen_image_edit_plus_dir() -> Path:
    return cached_dir(
        "tiny-qwen-image-edit-plus", VERSION, lambda path: _build(path, "QwenImageEditPlusPipeline")
    )
