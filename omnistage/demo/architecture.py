"""The demo model's architecture: a standard Wan 2.1 pipeline, shrunk to fit a 32x32 world.

Every part is the real library class (WanPipeline, AutoencoderKLWan, WanTransformer3DModel, UMT5EncoderModel,
FlowMatchEulerDiscreteScheduler) so the directory exercises the same loading and denoising code as a full
Wan checkpoint. The sizes are what trains in a few hours on two CPU cores:
- VAE: 4x spatial, 4x temporal compression (clips of 1 + 4k frames), 16 latent channels, so a 32x32 image
  is an 8x8 latent and a 9-frame clip a 3x8x8 one.
- DiT: patch 1 (64 tokens per latent frame, a token per 4x4 pixels), 12 blocks so cache-dit's default
  DBCache (8 front blocks always computed) has blocks left to skip. Patch 2 (16 tokens per frame, each
  covering 8x8 pixels) trained 2.4x faster per step but drew colour blobs, not shapes: a 9-13 pixel shape
  spanned one or two tokens, so its outline had to come out of a single token's projection. At the same
  4000-5000 steps patch 1 got the held-out shape right half the time against a third, and motion 86% against
  23% (docs/demo_model.md has the figures of the committed weights).
- Text: a word-level tokenizer over the caption vocabulary with T5's special ids, and a 2-layer UMT5.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

from omnistage.demo.scenes import vocabulary

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"  # T5's special tokens at their real ids 0, 1, 2
MAX_SEQUENCE_LENGTH = 512  # WanPipeline's default; training reproduces its padding exactly


@dataclasses.dataclass(frozen=True)
class DemoArchitecture:
    """Sizes of every component; `tiny()` is the same model at test scale."""

    text_dim: int = 64
    text_layers: int = 2
    text_heads: int = 4
    vae_base_dim: int = 16
    vae_z_dim: int = 16
    vae_res_blocks: int = 1
    dit_dim: int = 128
    dit_heads: int = 4
    dit_layers: int = 12
    dit_ffn: int = 384
    dit_patch: int = 1
    flow_shift: float = 2.0

    @classmethod
    def tiny(cls) -> DemoArchitecture:
        return cls(
            text_dim=16,
            text_heads=2,
            text_layers=1,
            vae_base_dim=8,
            vae_z_dim=4,
            dit_dim=32,
            dit_heads=2,
            dit_layers=2,
            dit_ffn=64,
        )


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer over the caption vocabulary: lowercase, punctuation dropped, '</s>' appended."""
    vocab = {PAD: 0, EOS: 1, UNK: 2}
    for word in vocabulary():
        vocab[word] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Lowercase(), normalizers.Replace(Regex(r"[^a-z0-9 ]"), " ")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", special_tokens=[(EOS, 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=MAX_SEQUENCE_LENGTH,
    )


def build_text_encoder(arch: DemoArchitecture, vocab_size: int) -> UMT5EncoderModel:
    config = UMT5Config(
        vocab_size=vocab_size,
        d_model=arch.text_dim,
        d_kv=arch.text_dim // arch.text_heads,
        d_ff=arch.text_dim * 2,
        num_layers=arch.text_layers,
        num_heads=arch.text_heads,
        relative_attention_num_buckets=16,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return UMT5EncoderModel(config)


def build_vae(arch: DemoArchitecture) -> AutoencoderKLWan:
    z = arch.vae_z_dim
    return AutoencoderKLWan(
        base_dim=arch.vae_base_dim,
        z_dim=z,
        dim_mult=[1, 2, 2],
        num_res_blocks=arch.vae_res_blocks,
        attn_scales=[],
        temperal_downsample=[True, True],
        latents_mean=[0.0] * z,  # replaced by the measured statistics once the VAE is trained
        latents_std=[1.0] * z,
        scale_factor_temporal=4,
        scale_factor_spatial=4,
    )


def build_transformer(arch: DemoArchitecture) -> WanTransformer3DModel:
    return WanTransformer3DModel(
        patch_size=(1, arch.dit_patch, arch.dit_patch),
        num_attention_heads=arch.dit_heads,
        attention_head_dim=arch.dit_dim // arch.dit_heads,
        in_channels=arch.vae_z_dim,
        out_channels=arch.vae_z_dim,
        text_dim=arch.text_dim,
        freq_dim=64,
        ffn_dim=arch.dit_ffn,
        num_layers=arch.dit_layers,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=256,
    )


def build_scheduler(arch: DemoArchitecture) -> FlowMatchEulerDiscreteScheduler:
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=arch.flow_shift)


def with_latent_stats(vae: AutoencoderKLWan, mean: list[float], std: list[float]) -> AutoencoderKLWan:
    """Records the latent statistics in the VAE config, where WanPipeline reads them to un-normalize."""
    vae.register_to_config(latents_mean=[float(m) for m in mean], latents_std=[float(s) for s in std])
    return vae


def assemble_pipeline(
    tokenizer: PreTrainedTokenizerFast,
    text_encoder: UMT5EncoderModel,
    vae: AutoencoderKLWan,
    transformer: WanTransformer3DModel,
    scheduler: FlowMatchEulerDiscreteScheduler,
) -> WanPipeline:
    return WanPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer, scheduler=scheduler
    )


def save_pipeline(pipe: WanPipeline, directory: Path) -> None:
    """float32 safetensors: the weights are small enough that halving them buys nothing worth the risk."""
    pipe.save_pretrained(directory, safe_serialization=True)
