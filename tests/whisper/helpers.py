"""Whisper test material: a tiny random Whisper (real architecture, tiny.en's tokenizer and special ids),
hibari-spoken clips at 16 kHz, and transformers' `generate` as the reference."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import torch

from omnistage.bench.datasets import SPOKEN_SENTENCES
from omnistage.cache import cached_dir
from omnistage.demo.whisper import tiny_en_ct2_dir

RATE = 16000
SENTENCES = list(SPOKEN_SENTENCES)  # plain words: tests/support/asr.py's `words` is the whole normaliser


def _build_random(path: Path) -> None:
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperTokenizerFast,
    )

    from omnistage.families.whisper.ct2 import generation_config

    src = tiny_en_ct2_dir()
    ct2 = json.loads((src / "config.json").read_text())
    tokenizer = WhisperTokenizerFast(tokenizer_file=str(src / "tokenizer.json"))
    config = WhisperConfig(
        vocab_size=51864,
        num_mel_bins=80,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,
        max_target_positions=448,
        pad_token_id=50256,
        bos_token_id=50256,
        eos_token_id=50256,
        decoder_start_token_id=50257,
        suppress_tokens=ct2["suppress_ids"],
        begin_suppress_tokens=ct2["suppress_ids_begin"],
        init_std=0.2,  # logits far apart: greedy picks are never near ties
    )
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    model.save_pretrained(path)
    GenerationConfig(**generation_config(tokenizer, ct2, multilingual=False)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(path)


def random_whisper_dir() -> Path:
    return cached_dir("tiny-whisper-random", "1", _build_random)


@functools.cache
def clip(index: int) -> np.ndarray:
    """SENTENCES[index] spoken by hibari, at 16 kHz."""
    from omnistage.families.hibari.voice import SAMPLE_RATE
    from omnistage.media import resample

    audio = np.asarray(_hibari()(SENTENCES[index], seed=0), dtype=np.float32).reshape(-1)
    return resample(audio, SAMPLE_RATE, RATE).astype(np.float32)


@functools.cache
def _hibari():
    from omnistage.families.hibari.voice import load_hibari

    return load_hibari()


class Reference:
    """transformers' WhisperForConditionalGeneration.generate, greedy, on the same features."""

    def __init__(self, model_dir: Path):
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

        self.model = WhisperForConditionalGeneration.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        self.features = WhisperFeatureExtractor.from_pretrained(model_dir)

    @torch.inference_mode()
    def tokens(self, audios: list[np.ndarray], max_new_tokens: int | None = None) -> list[list[int]]:
        """Greedy tokens of each clip, as one batched `generate` (every clip is padded to 30 s and the
        decoder prompt is the same, so batching pads nothing), end of text dropped."""
        feats = self.features(audios, sampling_rate=RATE, return_tensors="pt", device="cpu").input_features
        kwargs = {"max_new_tokens": max_new_tokens} if max_new_tokens else {}
        out = self.model.generate(feats, **kwargs)
        eos = self.model.generation_config.eos_token_id
        return [[t for t in row if t != eos] for row in out.tolist()]
