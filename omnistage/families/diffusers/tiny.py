"""Tiny random-weight diffusers pipelines of the real architectures: Wan2.1 T2V, Wan2.2 I2V, FLUX.1, SD3 and
Qwen-Image.

Every component is the real `diffusers` / `transformers` class with a small config, saved with
`save_pretrained` into a standard pipeline directory (`model_index.json`) and reloaded through
`DiffusionPipeline.from_pretrained` by the engine and the tests alike. Seeds are fixed, so a directory built
on one machine equals one built on another.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.cache import cached_dir
from omnistage.families.shared import tokenizer_builders as toks

VERSION = "1"
# Wan VAE latent statistics: one entry per latent channel (z_dim), or the VAE refuses the latents.
WAN_Z_DIM = 4
WAN_LATENTS_MEAN = [-0.75, 0.1, 0.96, -0.15]
WAN_LATENTS_STD = [2.8, 1.45, 2.3, 1.2]


def _seeded(seed: int):
    torch.manual_seed(seed)


def _umt5(d_model: int = 32):
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=128,
        d_model=d_model,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        pad_token_id=0,
        eos_token_id=1,
    )
    return UMT5EncoderModel(config).eval()


def _t5(d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=128,
        d_model=d_model,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        pad_token_id=0,
        eos_token_id=1,
    )
    return T5EncoderModel(config).eval()


def _clip_config(hidden: int, projection_dim: int):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=49408,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=77,
        projection_dim=projection_dim,
        bos_token_id=toks.CLIP_BOS_ID,
        eos_token_id=toks.CLIP_EOS_ID,
        pad_token_id=toks.CLIP_EOS_ID,
    )


def _wan_vae(base_dim: int = 8, res_blocks: int = 1):
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        base_dim=base_dim,
        z_dim=WAN_Z_DIM,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=res_blocks,
        temperal_downsample=[False, True, True],
        latents_mean=WAN_LATENTS_MEAN,
        latents_std=WAN_LATENTS_STD,
    )


def _wan_transformer(
    in_channels: int, *, dim: int = 24, heads: int = 2, layers: int = 2, ffn: int = 48, text_dim: int = 32
):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=heads,
        attention_head_dim=dim // heads,
        in_channels=in_channels,
        out_channels=WAN_Z_DIM,
        text_dim=text_dim,
        freq_dim=32,
        ffn_dim=ffn,
        num_layers=layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )


def _wan_scheduler():
    from diffusers import UniPCMultistepScheduler

    return UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=3.0
    )


def build_wan_t2v(
    path: Path,
    *,
    dim: int = 24,
    heads: int = 2,
    layers: int = 2,
    ffn: int = 48,
    vae: tuple[int, int] = (8, 1),
) -> None:
    """Wan2.1 text-to-video: UMT5 encoder, WanTransformer3DModel, AutoencoderKLWan, UniPC flow scheduler.

    `vae` = (base_dim, res_blocks) of the VAE."""
    from diffusers import WanPipeline

    _seeded(0)
    pipe = WanPipeline(
        tokenizer=toks.t5_tokenizer(),
        text_encoder=_umt5(),
        transformer=_wan_transformer(WAN_Z_DIM, dim=dim, heads=heads, layers=layers, ffn=ffn),
        vae=_wan_vae(*vae),
        scheduler=_wan_scheduler(),
    )
    pipe.save_pretrained(path)


def build_wan_i2v(path: Path) -> None:
    """Wan2.2 image-to-video (A14B layout): two transformers split at `boundary_ratio`, no CLIP image encoder.

    The transformer input is noise latents + 4 mask channels + the encoded first frame.
    """
    from diffusers import WanImageToVideoPipeline

    _seeded(1)
    in_channels = WAN_Z_DIM + 4 + WAN_Z_DIM
    pipe = WanImageToVideoPipeline(
        tokenizer=toks.t5_tokenizer(),
        text_encoder=_umt5(),
        vae=_wan_vae(),
        scheduler=_wan_scheduler(),
        image_processor=None,
        image_encoder=None,
        transformer=_wan_transformer(in_channels),
        transformer_2=_wan_transformer(in_channels),
        boundary_ratio=0.875,
    )
    pipe.save_pretrained(path)


def image_vae(latent_channels: int, scaling_factor: float, shift_factor: float):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 3,
        up_block_types=["UpDecoderBlock2D"] * 3,
        block_out_channels=[8, 8, 8],
        layers_per_block=1,
        latent_channels=latent_channels,
        norm_num_groups=4,
        sample_size=32,
        scaling_factor=scaling_factor,
        shift_factor=shift_factor,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def build_flux(path: Path) -> None:
    """FLUX.1-dev layout: CLIP (pooled) + T5 encoders, a guidance-distilled FluxTransformer2DModel."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    _seeded(2)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    )
    pipe = FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            shift=3.0,
            use_dynamic_shifting=True,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        ),
        vae=image_vae(4, scaling_factor=0.3611, shift_factor=0.1159),
        text_encoder=CLIPTextModel(_clip_config(32, 32)).eval(),
        tokenizer=toks.clip_tokenizer(),
        text_encoder_2=_t5(32),
        tokenizer_2=toks.t5_tokenizer(),
        transformer=transformer,
    )
    pipe.save_pretrained(path)


def build_sd3(path: Path) -> None:
    """Stable Diffusion 3 layout: two CLIP-with-projection encoders + T5, SD3Transformer2DModel (MMDiT)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    _seeded(3)
    transformer = SD3Transformer2DModel(
        sample_size=32,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        caption_projection_dim=16,
        pooled_projection_dim=32,
        out_channels=4,
        pos_embed_max_size=32,
    )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=image_vae(4, scaling_factor=1.5305, shift_factor=0.0609),
        text_encoder=CLIPTextModelWithProjection(_clip_config(16, 16)).eval(),
        tokenizer=toks.clip_tokenizer(),
        text_encoder_2=CLIPTextModelWithProjection(_clip_config(16, 16)).eval(),
        tokenizer_2=toks.clip_tokenizer(),
        text_encoder_3=_t5(32),
        tokenizer_3=toks.t5_tokenizer(),
    )
    pipe.save_pretrained(path)


def _qwen25_vl():
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 151936,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "max_position_embeddings": 1024,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1000000.0},
        },
        vision_config={
            "depth": 1,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "out_hidden_size": 32,
            "fullatt_block_indexes": [0],
            "window_size": 28,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    )
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def qwen_image_scheduler():
    """Qwen-Image's scheduler settings (dynamic exponential shift): its edit pipelines' too."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256,
        base_shift=0.5,
        max_image_seq_len=8192,
        max_shift=0.9,
        num_train_timesteps=1000,
        shift=1.0,
        shift_terminal=0.02,
        time_shift_type="exponential",
        use_dynamic_shifting=True,
    )


def build_qwen_image(path: Path) -> None:
    """Qwen-Image layout: Qwen2.5-VL text encoder (chat template), QwenImage MMDiT, causal VAE, true CFG."""
    from diffusers import (
        AutoencoderKLQwenImage,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )

    _seeded(4)
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        guidance_embeds=False,
        axes_dims_rope=(4, 6, 6),
    )
    vae = AutoencoderKLQwenImage(
        base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=WAN_LATENTS_MEAN,
        latents_std=WAN_LATENTS_STD,
    )
    scheduler = qwen_image_scheduler()
    pipe = QwenImagePipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=_qwen25_vl(),
        tokenizer=toks.qwen2_tokenizer(),
        transformer=transformer,
    )
    pipe.save_pretrained(path)


def build_stable_audio(path: Path, sample_size: int = 32, layers: int = 1, heads: int = 2) -> None:
    """Stable Audio Open layout: T5 encoder + number conditioners, StableAudioDiT, Oobleck VAE (stereo).
    `sample_size` (latent frames), `layers` and `heads` (of 8 dimensions) size the DiT for benchmarks."""
    from diffusers import (
        AutoencoderOobleck,
        EDMDPMSolverMultistepScheduler,
        StableAudioDiTModel,
        StableAudioPipeline,
    )
    from diffusers.pipelines.stable_audio.modeling_stable_audio import StableAudioProjectionModel

    _seeded(5)
    vae = AutoencoderOobleck(
        encoder_hidden_size=8,
        downsampling_ratios=[2, 2],
        channel_multiples=[1, 2],
        decoder_channels=8,
        decoder_input_channels=4,
        audio_channels=2,
        sampling_rate=16000,
    )
    transformer = StableAudioDiTModel(
        sample_size=sample_size,
        in_channels=4,
        num_layers=layers,
        attention_head_dim=8,
        num_attention_heads=heads,
        num_key_value_attention_heads=1,
        out_channels=4,
        cross_attention_dim=32,
        time_proj_dim=16,
        global_states_input_dim=64,
        cross_attention_input_dim=32,
    )
    pipe = StableAudioPipeline(
        vae=vae,
        text_encoder=_t5(32),
        projection_model=StableAudioProjectionModel(
            text_encoder_dim=32, conditioning_dim=32, min_value=0, max_value=32
        ),
        tokenizer=toks.t5_tokenizer(),
        transformer=transformer,
        scheduler=EDMDPMSolverMultistepScheduler(
            sigma_min=0.3, sigma_max=500, sigma_data=1.0, prediction_type="v_prediction"
        ),
    )
    pipe.save_pretrained(path)


BUILDERS = {
    "tiny-wan21-t2v": build_wan_t2v,
    "tiny-wan22-i2v": build_wan_i2v,
    "tiny-flux1": build_flux,
    "tiny-sd3": build_sd3,
    "tiny-qwen-image": build_qwen_image,
    "tiny-stable-audio": build_stable_audio,
}


def tiny_pipeline_dir(name: str) -> Path:
    """The cached directory of one tiny pipeline (built on first use)."""
    return cached_dir(name, VERSION, BUILDERS[name])


def stable_audio_bench_dir(sample_size: int = 1024, layers: int = 4, heads: int = 8) -> Path:
    """A Stable Audio checkpoint sized for the serving benchmark (random weights): the tiny one's forward
    takes a few milliseconds, so a request's figure would be its bookkeeping."""
    build = lambda p: build_stable_audio(p, sample_size, layers, heads)  # noqa: E731
    return cached_dir(f"bench-stable-audio-s{sample_size}l{layers}h{heads}", VERSION, build)


def wan_bench_dir(dim: int = 128, heads: int = 2, layers: int = 8, ffn: int = 384) -> Path:
    """A Wan2.1-architecture checkpoint sized for the serving benchmark (random weights).

    Its VAE is the smallest Wan VAE (base_dim 2, no residual blocks), so that, as in the real Wan models, the
    denoiser and not the video decoder dominates a request's time.
    """
    name = f"bench-wan21-t2v-d{dim}h{heads}l{layers}f{ffn}-vae2r0"
    build = lambda p: build_wan_t2v(p, dim=dim, heads=heads, layers=layers, ffn=ffn, vae=(2, 0))  # noqa: E731
    return cached_dir(name, VERSION, build)
