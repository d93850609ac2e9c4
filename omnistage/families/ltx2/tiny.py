"""Tiny LTX-2 checkpoints (text or an image to a video with its own sound track) built with diffusers' and
transformers' own classes: random weights, a Gemma 3 text encoder and a local Gemma tokenizer, saved as
`from_pretrained` reads them. Sizes follow diffusers' own LTX-2 test components; the vocoder's upsampling
equals the audio VAE's mel hop, so a clip's waveform lasts as long as its frames."""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.cache import cached_dir
from omnistage.families.shared import tokenizer_builders as toks

VERSION = "v2"
TEXT_HIDDEN = 16
TEXT_LAYERS = 2
SAMPLE_RATE = 16000
MEL_HOP = 160
# Gemma's special tokens at their real ids (pad 0, eos 1, bos 2, unk 3, mask 4).
GEMMA_SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}


def gemma_tokenizer():
    """A Gemma BPE tokenizer (spaces as "▁", byte fallback, BOS in front) as `transformers.GemmaTokenizer`,
    its merges learned on the shared corpus."""
    from transformers import GemmaTokenizer

    merges = toks._learn_bpe(toks._words(lambda text: [(text.replace(" ", "▁"), (0, len(text)))]), 300)
    alphabet = sorted({c for text in toks.CORPUS for c in text.replace(" ", "▁")})
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    vocab = dict(GEMMA_SPECIALS)
    for symbol in [*bytes_, *alphabet, *(a + b for a, b in merges)]:
        vocab.setdefault(symbol, len(vocab))
    return GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, model_max_length=1024)


def _gemma3(vocab_size: int):
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    text = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=TEXT_HIDDEN,
        intermediate_size=32,
        num_hidden_layers=TEXT_LAYERS,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=1024,
        sliding_window=64,
    )
    vision = SiglipVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=16,
        patch_size=4,
    )
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    return Gemma3ForConditionalGeneration(config).eval()


def build_ltx2(path: Path, image_to_video: bool = False) -> None:
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2ImageToVideoPipeline,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    torch.manual_seed(58)
    tokenizer = gemma_tokenizer()
    text_encoder = _gemma3(len(tokenizer))
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        caption_channels=TEXT_HIDDEN,
        rope_double_precision=False,
        rope_type="split",
    )
    connectors = LTX2TextConnectors(
        caption_channels=TEXT_HIDDEN,
        text_proj_in_factor=TEXT_LAYERS + 1,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    )
    vae = AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        layers_per_block=(1,),
        decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False),
        downsample_type=("spatial",),
        upsample_residual=(False,),
        upsample_factor=(1,),
        timestep_conditioning=False,
        patch_size=2,
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=SAMPLE_RATE,
        mel_hop_length=MEL_HOP,
        is_causal=True,
        mel_bins=8,
    )
    vocoder = LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[10, 8, 8, 4],
        upsample_factors=[5, 4, 4, 2],  # the mel hop: one waveform sample per audio sample
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=SAMPLE_RATE,
    )
    pipeline = LTX2ImageToVideoPipeline if image_to_video else LTX2Pipeline
    pipe = pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=vae,
        audio_vae=audio_vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        connectors=connectors,
        transformer=transformer,
        vocoder=vocoder,
    )
    pipe.save_pretrained(path)


def tiny_ltx2_dir(image_to_video: bool = False) -> Path:
    if image_to_video:
        return cached_dir("tiny-ltx2-i2v", VERSION, lambda p: build_ltx2(p, image_to_video=True))
    return cached_dir("tiny-ltx2", VERSION, build_ltx2)
