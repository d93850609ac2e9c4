"""VibeVoice checkpoints with random weights, built with transformers' own classes
(`VibeVoiceForConditionalGeneration` with its acoustic and semantic tokenizers) and saved as
`from_pretrained` reads them, with a local Qwen2 tokenizer and the acoustic feature extractor's config beside
them, so serving and the reference load the same directory through the real loading code.

`tiny_vibevoice_dir()`: tests (a 2-layer, 64-wide Qwen2, latents of 16, 40 samples a frame at 24 kHz).
`bench_vibevoice_dir(dtype)`: the benchmark's (`BENCH`: VibeVoice-1.5B's widths, a quarter of its layers).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from omnistage.cache import cached_dir

# The audio markers VibeVoice's tokenizer maps (Qwen2's vision tokens), and its end of text.
MARKERS = ("<|endoftext|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>")


def _config(lm: dict[str, Any], audio: dict[str, Any], head: dict[str, Any], ids: list[int]) -> dict:
    eos, bos, end, token = ids
    return dict(
        text_config=dict(model_type="qwen2", max_position_embeddings=8192, rms_norm_eps=1e-6, **lm),
        audio_config=dict(hidden_size=audio.pop("latent"), **audio),
        semantic_model_config=dict(hidden_size=audio.pop("semantic", 16), **audio),
        diffusion_head_config=head,
        pad_token_id=eos,
        eos_token_id=eos,
        audio_bos_token_id=bos,
        audio_eos_token_id=end,
        audio_token_id=token,
    )


TINY = dict(
    lm=dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=False,
    ),
    audio=dict(latent=16, semantic=16, num_filters=8, downsampling_ratios=[2, 4, 5], depths=[1, 1, 1, 1]),
    head=dict(num_hidden_layers=2, intermediate_size=128, frequency_embedding_size=32),
    # "another frame" at the lowest id of the four (_shape_head)
    specials=dict(zip(MARKERS, (601, 602, 603, 600), strict=True)),
)
# VibeVoice-1.5B's widths (Qwen2.5-1.5B: 1536 wide, 12/2 heads, 8960 FFN, its vocabulary; the diffusion
# head's 4 layers; latents of 64 at 3200 samples a frame), a quarter of its 28 layers, and acoustic/semantic
# tokenizers a quarter as wide (num_filters 8): the benchmark's per-frame work in the same proportions,
# sized for two cores.
BENCH = dict(
    lm=dict(
        hidden_size=1536,
        num_hidden_layers=7,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    audio=dict(latent=64, semantic=128, num_filters=8),
    head=dict(num_hidden_layers=4, intermediate_size=4608),
    # Qwen's ids; "another frame" is not the lowest of the four here: the head ties go to the end of text
    # unless its row is the lowest, so the bench's is moved below the others (_shape_head, both sides)
    specials=dict(zip(MARKERS, (151643, 151652, 151653, 151642), strict=True)),
)


def build(path: Path, spec: dict[str, Any], dtype: str = "float32") -> None:
    """Write a random-weight VibeVoice checkpoint into `path`."""
    import torch
    from transformers import (
        VibeVoiceAcousticTokenizerFeatureExtractor,
        VibeVoiceConfig,
        VibeVoiceForConditionalGeneration,
    )

    from omnistage.families.shared.tokenizer_builders import qwen2_tokenizer

    tokenizer = qwen2_tokenizer(spec["specials"])
    tokenizer.save_pretrained(str(path))
    spec = json.loads(json.dumps(spec))
    hop = math.prod(spec["audio"].get("downsampling_ratios", [2, 2, 4, 5, 5, 8]))
    VibeVoiceAcousticTokenizerFeatureExtractor(pad_to_multiple_of=hop).save_pretrained(str(path))
    lm = dict(spec["lm"])
    lm.setdefault("vocab_size", len(tokenizer))
    ids = [spec["specials"][m] for m in MARKERS]
    config = VibeVoiceConfig(**_config(lm, spec["audio"], spec["head"], ids))
    torch.manual_seed(0)
    model = VibeVoiceForConditionalGeneration(config).eval()
    with torch.no_grad():
        _shape_head(model, ids)
    model.generation_config.noise_scheduler_class = "DPMSolverMultistepScheduler"
    model.generation_config.noise_scheduler_config = {
        "beta_schedule": "squaredcos_cap_v2",
        "prediction_type": "v_prediction",
    }
    model.generation_config.guidance_scale = 1.3
    model.generation_config.num_diffusion_steps = 10
    model.to(getattr(torch, dtype)).save_pretrained(str(path))
    (path / "omnistage.json").write_text(json.dumps({"family": "vibevoice", "dtype": dtype}))


def _shape_head(model: Any, ids: list[int]) -> None:
    """The tiny LM made to speak until its cap: its head rows for the four tokens VibeVoice decodes are
    zeroed, so they tie and the lowest id, "another frame" (`audio_token_id`), wins every step (argmax
    takes the first maximum, on both sides). Tests that need a segment's end, a new segment or the end of
    speech force them, on both sides alike. The acoustic decoder's output is scaled to a speaking level
    (random weights are near silent)."""
    model.lm_head.weight[ids] = 0.0
    head = model.model.audio_tower.decoder.head.conv
    head.weight *= 1e4
    head.bias.zero_()


def _version(extra: str) -> str:
    return hashlib.sha256(Path(__file__).read_bytes() + extra.encode()).hexdigest()[:12]


def tiny_vibevoice_dir() -> Path:
    return cached_dir("tiny-vibevoice", _version("tiny"), lambda path: build(path, TINY))


def bench_vibevoice_dir(dtype: str = "float32") -> Path:
    return cached_dir(f"bench-vibevoice-{dtype}", _version(dtype), lambda path: build(path, BENCH, dtype))
