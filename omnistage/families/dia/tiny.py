"""Dia checkpoints with random weights, built with transformers' own classes (`DiaForConditionalGeneration`,
`DacModel`, `DiaProcessor` with its byte-level `DiaTokenizer` and `DiaFeatureExtractor`) and saved with
`save_pretrained`, so serving and the reference load them through the real loading code.

The DAC codec sits in `<dir>/dac`; the processor's config names that directory (the released processor
names "descript/dac_44khz" on the hub, which tests cannot reach).

`tiny_dia_dir()`: tests (4 channels of 64 codes, delay pattern [0, 2, 3, 4], 2-layer encoder (48 wide) and
decoder (64 wide), a small DAC at 44.1 kHz with a 32-sample hop).
`bench_dia_dir(dtype)`: the benchmark's, Dia-1.6B's widths (1024-wide encoder, 2048-wide decoder, 9
channels of 1028 ids, the released delay pattern, the 44.1 kHz DAC) with fewer layers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from omnistage.cache import cache_root, cached_dir

# Dia-1.6B's generation_config: CFG 3.0 and sampling (its `generate` clamps a temperature under 1 to 1).
GENERATION = {
    "do_sample": True,
    "temperature": 1.8,
    "top_p": 0.9,
    "top_k": 45,
    "guidance_scale": 3.0,
    "max_length": 3072,
}

TINY_DAC = dict(
    encoder_hidden_size=8,
    downsampling_ratios=[2, 4, 4],
    decoder_hidden_size=64,
    n_codebooks=4,
    codebook_size=64,
    codebook_dim=8,
    sampling_rate=44100,
)
TINY = dict(
    encoder_config=dict(
        hidden_size=48,  # narrower than the decoder, as Dia-1.6B's (1024 vs 2048)
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        vocab_size=256,
        initializer_range=0.1,
    ),
    decoder_config=dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        cross_num_attention_heads=4,
        cross_num_key_value_heads=2,
        cross_head_dim=16,
        cross_hidden_size=48,
        num_channels=4,
        vocab_size=68,  # 64 codes, then EOS, PAD, BOS (and one unused), as Dia's 1024 + 4
        eos_token_id=64,
        pad_token_id=65,
        bos_token_id=66,
        max_position_embeddings=1024,
        initializer_range=0.1,  # spread-out logits: greedy near-ties between implementations vanishingly rare
    ),
    delay_pattern=[0, 2, 3, 4],
    initializer_range=0.1,
)
# Dia-1.6B's widths (the configs' defaults: 9 channels, delay [0, 8, ..., 15]), 2 of 12 encoder layers and 4
# of 18 decoder layers; the released DAC (44.1 kHz, 9 codebooks of 1024, hop 512).
BENCH = dict(encoder_config=dict(num_hidden_layers=2), decoder_config=dict(num_hidden_layers=4))
BENCH_DAC = dict(downsampling_ratios=[2, 4, 8, 8], sampling_rate=44100)


def build(
    path: Path, final: Path, overrides: dict[str, Any], dac: dict[str, Any], dtype: str = "float32"
) -> None:
    """Write a random-weight Dia checkpoint, its DAC (`dac/`) and processor into `path` (`final`: where the
    directory ends up, which the processor's config names for its DAC)."""
    import torch
    from transformers import (
        DacConfig,
        DacModel,
        DiaConfig,
        DiaFeatureExtractor,
        DiaForConditionalGeneration,
        DiaProcessor,
        DiaTokenizer,
    )

    torch.manual_seed(0)
    config = DiaConfig(**overrides)
    model = DiaForConditionalGeneration(config).eval()
    decoder = config.decoder_config
    if overrides is TINY:
        # channel 0's EOS made likelier, so some tiny prompts end on their own before the length limit
        with torch.no_grad():
            model.logits_dense.weight[decoder.eos_token_id] *= 1.95
    model.generation_config.update(
        **GENERATION,
        bos_token_id=decoder.bos_token_id,
        eos_token_id=decoder.eos_token_id,
        pad_token_id=decoder.pad_token_id,
        decoder_start_token_id=decoder.bos_token_id,
    )
    model.to(getattr(torch, dtype)).save_pretrained(str(path))
    torch.manual_seed(1)
    codec = DacModel(DacConfig(**dac)).eval()
    _audible_codec(codec)
    codec.save_pretrained(str(path / "dac"))
    codec.name_or_path = str(final / "dac")
    extractor = DiaFeatureExtractor(sampling_rate=dac["sampling_rate"], hop_length=codec.config.hop_length)
    processor = DiaProcessor(extractor, DiaTokenizer(), audio_tokenizer=codec)
    processor.save_pretrained(str(path))
    (path / "omnistage.json").write_text(json.dumps({"family": "dia", "dtype": dtype}))


def _audible_codec(codec: Any) -> None:
    """A random DAC whose waveform tells its codes apart: its init (convs at std 0.02, codebooks at 0.02)
    decodes every code to a near-silent, near-equal waveform, so unit codebooks and PyTorch's default conv
    init; the last conv scaled so the waveform stays mostly within ±1 as speech does."""
    import torch
    from torch import nn

    with torch.no_grad():
        for module in codec.modules():
            if isinstance(module, nn.Conv1d | nn.ConvTranspose1d):
                module.reset_parameters()
            elif isinstance(module, nn.Embedding):
                module.weight.normal_()
        last = codec.decoder.conv2
        last.weight.mul_(0.3)
        last.bias.zero_()


def _version(extra: str) -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + extra.encode()).hexdigest()[:12]


def _cached(name: str, version: str, overrides: dict[str, Any], dac: dict[str, Any], dtype: str) -> Path:
    final = cache_root() / "models" / f"{name}-{version}"
    return cached_dir(name, version, lambda path: build(path, final, overrides, dac, dtype))


def tiny_dia_dir() -> Path:
    return _cached("tiny-dia", _version("tiny"), TINY, TINY_DAC, "float32")


def bench_dia_dir(dtype: str = "float32") -> Path:
    return _cached(f"bench-dia-{dtype}", _version(dtype), BENCH, BENCH_DAC, dtype)
