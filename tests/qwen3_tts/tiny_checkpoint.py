"""Tiny Qwen3-TTS checkpoints, built in omnistage's own venv (no reference needed) from `tiny_layout.json`:
the files and tensor shapes the reference's classes save for each variant (`worker.py layout`).

Weights come from numpy's PCG64 by tensor name (float64 normals scaled, then rounded to fp32), so a build
is bit-identical on any machine: `checkpoint_hash` keys the stored reference outputs, and a changed
checkpoint is detected rather than compared with stale data.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
LAYOUT = HERE / "tiny_layout.json"
SEEDS = {"custom_voice": 1, "voice_design": 2, "base": 3}
CODEC_EOS = 2150
EOS_ROW_GAIN = 2.5  # the talker head's EOS row, scaled up so some texts end on EOS
# The codec decoder's last conv: a random frame sequence decodes to std ~0.2, well off the +-1 clamp.
LAST_CONV_GAIN = 0.0065


def layout() -> dict:
    return json.loads(LAYOUT.read_text())


def _normal(name: str, seed: int, shape: list[int], std: float) -> np.ndarray:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:8], "little")))
    return (rng.standard_normal(shape) * std).astype(np.float32)


def _model_tensor(name: str, shape: list[int], seed: int) -> np.ndarray:
    """The talker, code predictor and speaker encoder: N(0, 0.2) everywhere."""
    value = _normal(name, seed, shape, 0.2)
    if name == "talker.codec_head.weight":
        value[CODEC_EOS] *= EOS_ROW_GAIN
    return value


def _codec_tensor(name: str, shape: list[int], last_conv: str) -> np.ndarray:
    """The 12 Hz codec at unit gain (its own init scales would give a ~1e-9 waveform)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("cluster_usage", "initialized") or leaf in ("gamma", "scale"):
        return np.ones(shape, np.float32)
    if leaf in ("alpha", "beta"):
        return _normal(name, 0, shape, 0.3)
    if leaf in ("embedding_sum", "embed_sum"):
        return _normal(name, 0, shape, 1.0)
    if len(shape) >= 2:
        value = _normal(name, 0, shape, float(np.prod(shape[1:])) ** -0.5)
        return value * np.float32(LAST_CONV_GAIN) if name == last_conv else value
    if "norm" in name:
        return np.ones(shape, np.float32) if leaf == "weight" else np.zeros(shape, np.float32)
    return _normal(name, 0, shape, 0.02)  # biases


def build(out: Path, variant: str) -> None:
    """`out` becomes a released-layout checkpoint of `variant` (custom_voice, voice_design, base)."""
    from safetensors.numpy import save_file

    spec = layout()[variant]
    for rel, content in spec["files"].items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(json.dumps(content, indent=2, sort_keys=True))
    for rel, tensors in spec["tensors"].items():
        if rel.startswith("speech_tokenizer/"):
            blocks = max(int(n.split(".")[2]) for n in tensors if n.startswith("decoder.decoder."))
            last = f"decoder.decoder.{blocks}.conv.weight"
            assert last in tensors, last
            state = {n: _codec_tensor(n, shape, last) for n, shape in tensors.items()}
        else:
            state = {n: _model_tensor(n, shape, SEEDS[variant]) for n, shape in tensors.items()}
        save_file(state, str(out / rel), metadata={"format": "pt"})
    build_tokenizer(out)


SPECIALS = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151671: "<|tts_pad|>",
            151672: "<|tts_text_bos|>", 151673: "<|tts_text_eod|>"}  # fmt: skip


def build_tokenizer(out: Path) -> None:
    """A byte-level BPE tokenizer with Qwen2's id layout: a small trained vocabulary padded with unused
    entries to 151643 ids, then the chat and TTS special tokens at their real ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["Hello there, this is a small voice test.", "The quick brown fox jumps over the lazy dog.",
              "assistant user system", "Speak slowly and clearly, in a warm voice!"] * 4  # fmt: skip
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(corpus, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for i in range(len(vocab), 151643):
        vocab[f"<|unused_{i}|>"] = i
    spec["added_tokens"] = [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, text in SPECIALS.items()
    ]  # fmt: skip
    tokenizer = Tokenizer.from_str(json.dumps(spec))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(str(out))


def checkpoint_hash(model_dir: Path) -> str:
    """A hash of what the checkpoint computes: its configs, tokenizer and tensors (names, shapes, bytes),
    not of file layouts a library version may change."""
    from safetensors import safe_open

    key = hashlib.sha256()
    root = Path(model_dir)
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.suffix == ".json":
            key.update(rel.encode())
            key.update(json.dumps(json.loads(path.read_text()), sort_keys=True).encode())
        elif path.suffix == ".safetensors":
            with safe_open(str(path), "np") as f:
                for name in sorted(f.keys()):
                    value = f.get_tensor(name)
                    key.update(f"{rel}:{name}:{value.dtype}:{value.shape}".encode())
                    key.update(np.ascontiguousarray(value).tobytes())
    return key.hexdigest()[:24]
