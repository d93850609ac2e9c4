"""The Qwen3-TTS reference, called in its own venv (transformers 5.17, see reference_env.sh): tiny
checkpoints built by the reference's config and model classes, and its greedy outputs for them, cached by
content hash (checkpoint weights, requests, the worker's code) so each is computed once per machine.

Without the reference venv these tests skip, naming the command that makes it (`make qwen3-tts-reference`).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from omnistage.demo.cache import cache_root, cached_dir

HERE = Path(__file__).parent
WORKER = HERE / "reference" / "worker.py"
VARIANTS = ("custom_voice", "voice_design", "base")
STAMP = ".installed-qwen-tts-hf-0.1.1.post1"


def reference_python() -> Path:
    """The reference venv's python, or a skip saying how to make it."""
    venv = Path(os.environ.get("QWEN3_TTS_REFERENCE_VENV") or cache_root() / "qwen3-tts-ref" / "venv")
    if not (venv / STAMP).exists():
        pytest.skip(f"the Qwen3-TTS reference venv {venv} is absent: run `make qwen3-tts-reference`")
    return venv / "bin" / "python"


def _call(*args: str) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(reference_python()), str(WORKER), *args], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"reference worker {args[0]} failed:\n{done.stderr[-4000:]}")


def tiny_dir(variant: str) -> Path:
    """The tiny checkpoint of `variant` (custom_voice, voice_design, base), built once per machine."""
    version = hashlib.sha256(WORKER.read_bytes()).hexdigest()[:12]
    return cached_dir(f"tiny-qwen3-tts-{variant}", version, lambda path: _call("build", str(path), variant))


def reference_codes(model_dir: Path, requests: list[dict[str, Any]]) -> list[torch.Tensor]:
    """The reference's greedy talker codes ([T, 16], EOS cut) for each request, run one at a time."""
    key = hashlib.sha256()
    key.update((Path(model_dir) / "model.safetensors").read_bytes())
    key.update(WORKER.read_bytes())
    key.update(json.dumps(requests, sort_keys=True).encode())
    out = cache_root() / "qwen3-tts-ref" / "outputs" / f"codes-{key.hexdigest()[:24]}.pt"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        spec = out.with_suffix(".json")
        spec.write_text(json.dumps(requests))
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        _call("codes", str(model_dir), str(spec), str(tmp))
        tmp.rename(out)
    return torch.load(out)


def reference_waveforms(model_dir: Path, codes: list[torch.Tensor]) -> list[torch.Tensor]:
    """The reference codec's fp32 waveform (`Qwen3TTSTokenizerV2Model.decode`) of each [T, 16] codes."""
    key = hashlib.sha256()
    key.update((Path(model_dir) / "speech_tokenizer" / "model.safetensors").read_bytes())
    key.update(WORKER.read_bytes())
    for c in codes:
        key.update(c.to(torch.long).numpy().tobytes())
    out = cache_root() / "qwen3-tts-ref" / "outputs" / f"wavs-{key.hexdigest()[:24]}.pt"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        spec = out.with_suffix(".codes.pt")
        torch.save([c.to(torch.long) for c in codes], spec)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        _call("decode", str(model_dir), str(spec), str(tmp))
        tmp.rename(out)
    return torch.load(out)


def reference_clone(model_dir: Path, requests: list[dict[str, Any]], clips: list[torch.Tensor]) -> dict:
    """Base x-vector-only cloning in the reference: {"xvectors": [[enc_dim]], "codes": [[T, 16]]}."""
    key = hashlib.sha256()
    key.update((Path(model_dir) / "model.safetensors").read_bytes())
    key.update(WORKER.read_bytes())
    key.update(json.dumps(requests, sort_keys=True).encode())
    for clip in clips:
        key.update(clip.float().numpy().tobytes())
    out = cache_root() / "qwen3-tts-ref" / "outputs" / f"clone-{key.hexdigest()[:24]}.pt"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        spec, audio = out.with_suffix(".json"), out.with_suffix(".clips.pt")
        spec.write_text(json.dumps(requests))
        torch.save([c.float() for c in clips], audio)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        _call("clone", str(model_dir), str(spec), str(audio), str(tmp))
        tmp.rename(out)
    return torch.load(out)
