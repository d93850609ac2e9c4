"""The tiny checkpoints' tokenizers and configs: deterministic, with the families' special tokens at their
real ids, and self-consistent (a Wan VAE's latent statistics match its z_dim)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnistage.families.shared import tokenizer_builders as toks
from tests.diffusion.helpers import model_dir

pytestmark = pytest.mark.unit


def test_tokenizers_are_deterministic_with_real_special_ids():
    clip_a, clip_b = toks.clip_tokenizer(), toks.clip_tokenizer()
    text = "An astronaut riding a horse on the moon"
    assert clip_a(text).input_ids == clip_b(text).input_ids
    ids = clip_a(text).input_ids
    assert ids[0] == toks.CLIP_BOS_ID == 49406 and ids[-1] == toks.CLIP_EOS_ID == 49407
    t5 = toks.t5_tokenizer()
    assert (t5.pad_token_id, t5.eos_token_id, t5.unk_token_id) == (0, 1, 2)
    assert t5("a cat").input_ids[-1] == 1
    qwen = toks.qwen2_tokenizer()
    ids = qwen("<|im_start|>user\na cat<|im_end|>").input_ids
    assert ids[0] == 151644 and ids[-1] == 151645


def test_wan_vae_statistics_match_its_latent_channels():
    for name in ("tiny-wan21-t2v", "tiny-wan22-i2v"):
        config = json.loads((Path(model_dir(name)) / "vae" / "config.json").read_text())
        assert len(config["latents_mean"]) == len(config["latents_std"]) == config["z_dim"]
    index = json.loads((Path(model_dir("tiny-wan22-i2v")) / "model_index.json").read_text())
    assert index["boundary_ratio"] == 0.875 and index["transformer_2"][1] == "WanTransformer3DModel"
