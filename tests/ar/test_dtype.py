"""The compute dtype "auto" picks from a checkpoint's config: its own dtype, except on a CPU, where fp16 runs
in bf16 and bf16 runs in float32 unless oneDNN computes it natively here, and a quantized checkpoint (a GGUF's
blocks beside it) runs in bf16 where oneDNN computes it natively."""

from __future__ import annotations

import json

import pytest
import torch

from omnistage.stages.ar.cpu.quantized_linear import BLOCKS_FILE
from omnistage.stages.ar.loader import cpu_has_native, resolve_dtype

NATIVE_BF16 = torch.bfloat16 if cpu_has_native(torch.bfloat16) else torch.float32


@pytest.mark.parametrize(
    ("stored", "expected"),
    [("float32", torch.float32), ("bfloat16", NATIVE_BF16), ("float16", NATIVE_BF16), (None, torch.float32)],
)
def test_auto_on_a_cpu(tmp_path, stored, expected) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"dtype": stored} if stored else {}))
    assert resolve_dtype("auto", str(tmp_path), "cpu") is expected


def test_auto_keeps_the_checkpoint_dtype_off_the_cpu(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    assert resolve_dtype("auto", str(tmp_path), "cuda") is torch.float16


@pytest.mark.parametrize("requested", ["float32", "bfloat16", "float16"])
def test_an_explicit_dtype_is_honoured(tmp_path, requested) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float16"}))
    assert resolve_dtype(requested, str(tmp_path), "cpu") is getattr(torch, requested)


@pytest.mark.parametrize("stored", ["float32", "bfloat16", None])
def test_auto_computes_a_quantized_checkpoint_in_native_bf16(tmp_path, stored) -> None:
    """A GGUF's conversion (float32 weights, its blocks beside them) is served in bf16 where this CPU has it
    natively, in float32 where it does not; asked for float32, it gets float32."""
    (tmp_path / "config.json").write_text(json.dumps({"dtype": stored} if stored else {}))
    (tmp_path / BLOCKS_FILE).write_bytes(b"")
    assert resolve_dtype("auto", str(tmp_path), "cpu") is NATIVE_BF16
    assert resolve_dtype("float32", str(tmp_path), "cpu") is torch.float32
