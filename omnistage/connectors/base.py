"""Raw-buffer form of tensors, arrays and images: a small msgspec header plus the bytes.

Never pickled: a header names dtype, shape and kind, so a receiver rebuilds the object from the buffer.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import numpy as np
import torch

_TORCH_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
    )
}


class TensorRef(msgspec.Struct, frozen=True, array_like=True):
    """Header of a payload. `key` is set when the bytes live in a connector (shared memory)."""

    kind: str  # torch | numpy | pil
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    key: str = ""
    mode: str = ""  # PIL image mode
    owned: bool = True  # the receiver releases the segment after reading it
    created: float = 0.0


class Payload:
    """A tensor-like value waiting in a connector: what the orchestrator holds instead of the data."""

    __slots__ = ("ref",)

    def __init__(self, ref: TensorRef):
        self.ref = ref

    def __repr__(self) -> str:
        return f"Payload({self.ref.kind} {self.ref.dtype}{list(self.ref.shape)} @{self.ref.key})"


def is_payload_value(obj: Any) -> bool:
    return isinstance(obj, torch.Tensor | np.ndarray) or type(obj).__module__.startswith("PIL.")


def encode_payload(obj: Any) -> tuple[TensorRef, memoryview]:
    """Header and bytes for a tensor, numpy array or PIL image."""
    now = time.time()
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        raw = t.view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)
        ref = TensorRef("torch", str(t.dtype).removeprefix("torch."), tuple(t.shape), t.nbytes, created=now)
        return ref, memoryview(raw).cast("B")
    if isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        return TensorRef("numpy", a.dtype.str, a.shape, a.nbytes, created=now), memoryview(a).cast("B")
    a = np.asarray(obj)
    ref = TensorRef("pil", a.dtype.str, a.shape, a.nbytes, mode=obj.mode, created=now)
    return ref, memoryview(np.ascontiguousarray(a)).cast("B")


def decode_payload(ref: TensorRef, buf: memoryview | bytes | bytearray, owned: bool = False) -> Any:
    """Rebuild the value from its header and bytes; the result owns a copy of the bytes (`owned`: `buf` is a
    bytearray of exactly the payload that nothing else holds, so the value takes it without a copy)."""
    data = buf if owned else bytearray(buf[: ref.nbytes])
    if ref.kind == "torch":
        dtype = _TORCH_DTYPES[ref.dtype]
        if ref.nbytes == 0:
            return torch.empty(ref.shape, dtype=dtype)
        flat = torch.frombuffer(data, dtype=torch.uint8)
        return flat.view(dtype).reshape(ref.shape)
    array = np.frombuffer(data, dtype=np.dtype(ref.dtype)).reshape(ref.shape)
    if ref.kind == "pil":
        from PIL import Image

        return Image.fromarray(array, mode=ref.mode) if ref.mode else Image.fromarray(array)
    return array
