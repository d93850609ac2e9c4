"""GGUF files (llama.cpp's single-file checkpoints) turned into standard model directories.

transformers reads a GGUF file and dequantizes it into its own model class, but that takes tens of seconds
on a small CPU, and every stage process would pay it again. So the first load converts the file once into a
safetensors + tokenizer directory in the omnistage cache, keyed by the file's content hash, and every later
load (each stage process, each server start) reads that directory like any other checkpoint. The weights
are saved in float32, which holds dequantized values exactly, and the file's quantized blocks beside them
(gguf_blocks.py), which the AR engine computes with on a CPU.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from omnistage.cache import cached_dir
from omnistage.errors import ConfigError

logger = logging.getLogger(__name__)

# bump when the converted layout changes, so old cache entries are not reused (v2: the blocks file)
CONVERSION_VERSION = "v2"
QUANT_TAG = re.compile(r"[.-](i?q\d\w*|f16|f32|bf16)$", re.IGNORECASE)
STANDARD_FILES = ("config.json", "model_index.json")


def find_gguf(path: Path) -> Path | None:
    """The GGUF file `path` stands for: the file itself, or the one in a directory that has no config of
    its own (a directory with `config.json` is a standard checkpoint even if a GGUF lies beside it)."""
    if path.is_file():
        return path if path.suffix.lower() == ".gguf" else None
    if not path.is_dir() or any((path / name).exists() for name in STANDARD_FILES):
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        names = ", ".join(f.name for f in files)
        raise ConfigError(f"{path} holds {len(files)} GGUF files ({names}); pass the one to serve")
    return files[0] if files else None


def served_name(gguf: Path) -> str:
    """A readable model name: the file name without its quantization tag, lower-case
    (`SmolLM2-135M-Instruct.Q4_1.gguf` → `smollm2-135m-instruct`)."""
    return QUANT_TAG.sub("", gguf.stem).lower()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def converted_dir(gguf: Path) -> Path:
    """The standard directory for `gguf`, converting it on first use. Safe under concurrency: the cache
    holds a lock while one process converts, and the directory appears only once complete."""
    name = served_name(gguf)
    root = cached_dir(
        f"gguf-{file_digest(gguf)[:16]}", CONVERSION_VERSION, lambda tmp: convert(gguf, tmp / name)
    )
    return root / name


def convert(gguf: Path, out: Path) -> None:
    """Dequantize `gguf` with transformers and save the model (float32), its tokenizer and the file's
    quantized blocks into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnistage.families.llm.gguf_blocks import write_blocks

    logger.info("converting %s to a safetensors directory (once per file)", gguf)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
    except (ValueError, KeyError, OSError) as exc:
        raise ConfigError(f"transformers cannot load the GGUF file {gguf}: {exc}") from exc
    # The weights are plain dequantized tensors now; transformers only refuses to save while the model
    # still names the GGUF quantizer it was loaded through.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    write_blocks(gguf, model, out)
