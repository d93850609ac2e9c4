"""The Qwen3-TTS reference's outputs for the tiny checkpoints, stored in the repository
(`reference_outputs/*.npz`: codes as int16, waveforms and x-vectors as float32), so the equality tests run
without the reference's venv (transformers 5.17 + qwen-tts-hf, see reference_env.sh).

Each stored output is found by a hash of what was asked (kind, requests, clips, codes) and records the hash
of the checkpoint it was made for (`tiny_checkpoint.checkpoint_hash`): a changed checkpoint fails the test,
saying to rerun `python tests/qwen3_tts/make_reference_outputs.py`, which runs the tests with
QWEN3_TTS_RECORD=1 so that each of these calls runs the reference in its venv and stores what it gives.
`fresh=True` runs the reference now instead (test_reference_outputs checks the stored outputs with it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from omnistage.cache import cache_root, cached_dir
from tests.qwen3_tts import tiny_checkpoint

HERE = Path(__file__).parent
WORKER = HERE / "reference" / "worker.py"
STORE = HERE / "reference_outputs"
VARIANTS = ("custom_voice", "voice_design", "base")
STAMP = ".installed-qwen-tts-hf-0.1.1.post1"
REMAKE = "rerun `python tests/qwen3_tts/make_reference_outputs.py` (needs tests/qwen3_tts/reference_env.sh)"


def recording() -> bool:
    return os.environ.get("QWEN3_TTS_RECORD") == "1"


def reference_venv() -> Path:
    return Path(os.environ.get("QWEN3_TTS_REFERENCE_VENV") or cache_root() / "qwen3-tts-ref" / "venv")


def reference_python() -> Path:
    """The reference venv's python, or a skip saying how to make it."""
    venv = reference_venv()
    if not (venv / STAMP).exists():
        pytest.skip(f"the Qwen3-TTS reference venv {venv} is absent: run tests/qwen3_tts/reference_env.sh")
    return venv / "bin" / "python"


def call_reference(*args: str) -> None:
    """`worker.py ARGS...` in the reference venv."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(reference_python()), str(WORKER), *args], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"reference worker {args[0]} failed:\n{done.stderr[-4000:]}")


def tiny_dir(variant: str) -> Path:
    """The tiny checkpoint of `variant` (custom_voice, voice_design, base), built once per machine."""
    version = hashlib.sha256(
        Path(tiny_checkpoint.__file__).read_bytes() + tiny_checkpoint.LAYOUT.read_bytes()
    ).hexdigest()[:12]
    return cached_dir(f"tiny-qwen3-tts-{variant}", version, lambda path: tiny_checkpoint.build(path, variant))


@functools.cache
def _checkpoint(model_dir: Path) -> str:
    return tiny_checkpoint.checkpoint_hash(model_dir)


def _stored(
    kind: str, model_dir: Path, key: hashlib._Hash, compute: Callable[[], dict[str, Any]], fresh: bool
) -> dict[str, np.ndarray]:
    """The stored output `kind` for this key (recorded first under QWEN3_TTS_RECORD=1), checked to be for
    this checkpoint; `compute()` runs the reference and returns the arrays to store."""
    checkpoint = _checkpoint(Path(model_dir))
    path = STORE / f"{kind}-{key.hexdigest()[:20]}.npz"
    if fresh or recording():
        arrays = {name: np.asarray(value) for name, value in compute().items()}
        if fresh:
            return arrays
        STORE.mkdir(exist_ok=True)
        np.savez(path, checkpoint=np.array(checkpoint), **arrays)
    if not path.exists():
        pytest.fail(f"no stored reference output {path.name} for these inputs: {REMAKE}")
    with np.load(path, allow_pickle=False) as data:
        stored = {name: data[name] for name in data.files}
    if str(stored.pop("checkpoint")) != checkpoint:
        pytest.fail(f"{Path(model_dir).name} is not the checkpoint {path.name} was made for: {REMAKE}")
    return stored


def _key(kind: str, model_dir: Path, payload: Any) -> hashlib._Hash:
    key = hashlib.sha256(kind.encode())
    variant = json.loads((Path(model_dir) / "config.json").read_text())["tts_model_type"]
    key.update(variant.encode())  # the same codes decoded by two variants' codecs are two outputs
    key.update(json.dumps(payload, sort_keys=True).encode())
    return key


def _listed(arrays: dict[str, np.ndarray], prefix: str) -> list[torch.Tensor]:
    count = sum(1 for name in arrays if name.startswith(prefix))
    return [torch.from_numpy(np.array(arrays[f"{prefix}{i}"])) for i in range(count)]


def reference_codes(
    model_dir: Path, requests: list[dict[str, Any]], fresh: bool = False
) -> list[torch.Tensor]:
    """The reference's greedy talker codes ([T, 16] long, EOS cut) for each request, run one at a time."""

    def compute() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            spec, out = Path(tmp) / "requests.json", Path(tmp) / "out.pt"
            spec.write_text(json.dumps(requests))
            call_reference("codes", str(model_dir), str(spec), str(out))
            return {f"codes_{i}": c.to(torch.int16).numpy() for i, c in enumerate(torch.load(out))}

    stored = _stored("codes", model_dir, _key("codes", model_dir, requests), compute, fresh)
    return [c.long() for c in _listed(stored, "codes_")]


def reference_waveforms(
    model_dir: Path, codes: list[torch.Tensor], frames: tuple[int, int] | None = None, fresh: bool = False
) -> list[torch.Tensor]:
    """The reference codec's fp32 waveform (`Qwen3TTSTokenizerV2Model.decode`) of each [T, 16] codes;
    with `frames` (lo, hi), only those frames' samples (a long decode's join, stored small)."""
    key = _key("wavs", model_dir, frames)
    for c in codes:
        key.update(c.to(torch.int16).numpy().tobytes())

    def compute() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            spec, out = Path(tmp) / "codes.pt", Path(tmp) / "out.pt"
            torch.save([c.to(torch.long) for c in codes], spec)
            call_reference("decode", str(model_dir), str(spec), str(out))
            wavs = torch.load(out)
        per = 1920
        if frames is not None:
            wavs = [w[frames[0] * per : frames[1] * per] for w in wavs]
        return {f"wave_{i}": w.float().numpy() for i, w in enumerate(wavs)}

    return _listed(_stored("wavs", model_dir, key, compute, fresh), "wave_")


def _clips_key(task: str, model_dir: Path, what: Any, clips: list[torch.Tensor]) -> Any:
    key = _key(task, model_dir, what)
    for clip in clips:
        key.update(clip.float().numpy().tobytes())
    return key


def _call_with_clips(
    task: str, model_dir: Path, requests: list[dict[str, Any]], clips: list[torch.Tensor]
) -> dict[str, Any]:
    """The reference's `task` on `requests` with their reference `clips` (files in and out of its venv)."""
    with tempfile.TemporaryDirectory() as tmp:
        spec, audio, out = Path(tmp) / "requests.json", Path(tmp) / "clips.pt", Path(tmp) / "out.pt"
        spec.write_text(json.dumps(requests))
        torch.save([c.float() for c in clips], audio)
        call_reference(task, str(model_dir), str(spec), str(audio), str(out))
        return torch.load(out)


def reference_clone(
    model_dir: Path, requests: list[dict[str, Any]], clips: list[torch.Tensor], fresh: bool = False
) -> dict[str, list[torch.Tensor]]:
    """Base x-vector-only cloning in the reference: {"xvectors": [[enc_dim]], "codes": [[T, 16]]}."""
    key = _clips_key("clone", model_dir, requests, clips)

    def compute() -> dict[str, Any]:
        got = _call_with_clips("clone", model_dir, requests, clips)
        arrays = {f"xvector_{i}": x.float().numpy() for i, x in enumerate(got["xvectors"])}
        return arrays | {f"codes_{i}": c.to(torch.int16).numpy() for i, c in enumerate(got["codes"])}

    stored = _stored("clone", model_dir, key, compute, fresh)
    return {"xvectors": _listed(stored, "xvector_"), "codes": [c.long() for c in _listed(stored, "codes_")]}


def reference_icl(
    model_dir: Path,
    requests: list[dict[str, Any]],
    clips: list[torch.Tensor],
    waveforms: bool = False,
    fresh: bool = False,
) -> dict[str, list[torch.Tensor]]:
    """Base in-context cloning in the reference (`generate_voice_clone` without x_vector_only_mode): each
    clip's codes ("ref_codes", [R, 16]) and greedy codes ("codes"), with `waveforms` also the waveform of
    clip codes + codes with the clip's share cut ("wavs")."""
    key = _clips_key("icl", model_dir, [requests, waveforms], clips)

    def compute() -> dict[str, Any]:
        got = _call_with_clips("icl", model_dir, requests, clips)
        arrays = {f"ref_codes_{i}": c.to(torch.int16).numpy() for i, c in enumerate(got["ref_codes"])}
        arrays |= {f"codes_{i}": c.to(torch.int16).numpy() for i, c in enumerate(got["codes"])}
        if waveforms:
            arrays |= {f"wave_{i}": w.float().numpy() for i, w in enumerate(got["wavs"])}
        return arrays

    stored = _stored("icl", model_dir, key, compute, fresh)
    result = {name: [c.long() for c in _listed(stored, f"{name}_")] for name in ("ref_codes", "codes")}
    return result | {"wavs": _listed(stored, "wave_")}
