"""Sesame CSM checkpoints with random weights, built with transformers' own classes
(`CsmForConditionalGeneration` with its Mimi codec, `CsmProcessor`) and saved with `save_pretrained`, so
serving and the reference load them through the real loading code. The tokenizer is a local Llama 3 BPE
with CSM's audio tokens at their real ids; the chat template renders as the released one's (speaker-tagged
turns, each earlier turn followed by its audio).

`tiny_csm_dir()`: tests (8 codebooks of 64 codes, 2-layer backbone and depth decoder, a small Mimi).
`bench_csm_dir(dtype)`: the benchmark's, csm-1b's widths (2048-wide backbone, 1024-wide depth decoder, 32
codebooks of 2051 codes, the released Mimi) with fewer layers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omnistage.cache import cached_dir

AUDIO_TOKENS = {"<|AUDIO|>": 128002, "<|audio_eos|>": 128003}
# The released template's rendering: every turn "<bos>[speaker]text<eos>", an earlier turn's audio after it.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if not message['role'] is string or not message['role'].isdigit() %}"
    "{{- raise_exception(\"The role must be an integer or a stringified integer (e.g. '0') designating the"
    ' speaker id") }}'
    "{%- endif %}"
    "{{- bos_token }}{{- '[' + message['role'] + ']' }}{{- message['content'][0]['text'] }}{{- eos_token }}"
    "{%- if message['content']|length > 1 %}{{- '<|AUDIO|><|audio_eos|>' }}{%- endif %}"
    "{%- endfor %}"
)
# csm-1b's generation defaults: both the backbone and the depth decoder sample (temperature 0.9, top-k 50).
# (save_pretrained stores the depth decoder's own as `depth_decoder_*` keys)
GENERATION = {"do_sample": True, "temperature": 0.9, "top_k": 50}

TINY_MIMI = dict(
    hidden_size=32,
    num_filters=4,
    upsampling_ratios=[8, 6, 5, 4],
    codebook_size=64,
    codebook_dim=16,
    num_quantizers=8,
    vector_quantization_hidden_dimension=16,
    upsample_groups=32,
    num_hidden_layers=2,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=4,
    sliding_window=250,
)
TINY = dict(
    num_codebooks=8,
    vocab_size=64,
    codebook_pad_token_id=63,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    initializer_range=0.1,  # spread-out logits: greedy near-ties between implementations vanishingly rare
    depth_decoder_config=dict(
        num_codebooks=8,
        backbone_hidden_size=64,
        vocab_size=64,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=9,
        initializer_range=0.1,
    ),
    codec_config=dict(model_type="mimi", **TINY_MIMI),
)
# csm-1b's widths and codebooks (its Mimi is transformers' default MimiConfig), 4 of 16 backbone layers and
# 2 of 4 depth decoder layers. Mimi's codebooks hold 4096 codes, not 2048: random weights emit all 2051 of
# CSM's codes (the trained model never emits 2048..2050), and Mimi's codebook size is a power of two.
BENCH = dict(
    num_hidden_layers=4,
    depth_decoder_config=dict(num_hidden_layers=2),
    codec_config=dict(model_type="mimi", codebook_size=4096),
)


def build(path: Path, overrides: dict[str, Any], dtype: str = "float32", seed: int = 0) -> None:
    """Write a random-weight CSM checkpoint, its processor (tokenizer, feature extractor, chat template) and
    csm-1b's generation defaults into `path`."""
    import torch
    from transformers import CsmConfig, CsmForConditionalGeneration, CsmProcessor, EncodecFeatureExtractor

    from omnistage.families.shared.tokenizer_builders import llama3_tokenizer

    torch.manual_seed(seed)
    config = CsmConfig(**overrides)
    model = CsmForConditionalGeneration(config).eval()
    _audible_codec(model.codec_model)
    model.generation_config.update(**GENERATION)
    model.depth_decoder.generation_config.update(**GENERATION)
    model.to(getattr(torch, dtype)).save_pretrained(str(path))
    tokenizer = llama3_tokenizer(AUDIO_TOKENS, pad_token="<|AUDIO|>")  # the config's pad_token_id
    extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=24000, padding_value=0.0)
    processor = CsmProcessor(extractor, tokenizer, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(str(path))
    (path / "omnistage.json").write_text(json.dumps({"family": "csm", "dtype": dtype}))


def _audible_codec(codec: Any) -> None:
    """A random Mimi whose waveform tells its codes apart: a fresh Mimi's codebook vectors are all zero (its
    init: every code would decode alike) and its transformer's layer scales 0.01 (its share of the waveform
    under float rounding), so random codebooks, layer scales of 1 and 8x sharper attention; the last conv
    scaled down, a waveform mostly within ±1 as speech is (a random SEANet's swings ±30)."""
    import torch
    from transformers.models.mimi.modeling_mimi import MimiEuclideanCodebook

    with torch.no_grad():
        for module in codec.modules():
            if isinstance(module, MimiEuclideanCodebook):
                module.embed_sum.normal_()
                module._embed = None
        for name, param in codec.decoder.decoder_transformer.named_parameters():
            if name.endswith("layer_scale.scale"):
                param.fill_(1.0)
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(8)
        last = codec.decoder.decoder_seanet.layers[-1].conv
        last.weight.mul_(0.03)
        last.bias.mul_(0.03)


def _version(extra: str) -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + extra.encode()).hexdigest()[:12]


def tiny_csm_dir() -> Path:
    return cached_dir("tiny-csm", _version("tiny"), lambda path: build(path, TINY))


def bench_csm_dir(dtype: str = "float32") -> Path:
    return cached_dir(f"bench-csm-{dtype}", _version(dtype), lambda path: build(path, BENCH, dtype))
