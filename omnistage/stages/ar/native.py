"""The AR engine's native CPU kernels (csrc/), compiled once on the machine that runs them.

On a 2-core Xeon a decode step of 32 sequences spent about a quarter of its time in attention: gathering each
sequence's keys and values out of the paged cache into padded copies, then SDPA on many tiny problems. The
decode kernel (paged_decode.cpp) reads the cache rows in place and does all of a sequence's heads in one
task (the engine's decode steps were 8-13% faster with it, benchmarks/RESULTS.md). The pointwise kernels
(decoder_pointwise.cpp: RMS norm with its residual add, rotary embedding, SiLU-times-up) replace some thirty
tiny torch ops per layer with four calls, and `write_cache` puts a step's keys and values into their slots.
They need AVX-512 and a C++ compiler; anywhere else, or with OMNISTAGE_NATIVE_KERNELS=0, the engine stays on
torch ops (SDPA for attention). `make setup` builds them (`python -m omnistage.stages.ar.native`), so the
first engine start does not wait for the compiler; the build lives under torch's extension cache
(TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
# no FMA contraction: the pointwise kernels round like the torch ops they replace
FLAGS = [
    *("-O3", "-fopenmp", "-ffp-contract=off"),
    *("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma"),
]
SWITCH = "OMNISTAGE_NATIVE_KERNELS"  # "0": torch ops only
DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def kernels() -> Any | None:
    """The compiled module, or None (the reason logged once) where it cannot be used here."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    if torch.backends.cpu.get_cpu_capability() != "AVX512":
        logger.info("native AR kernels off: this CPU has no AVX-512")
        return None
    try:
        from torch.utils.cpp_extension import load

        files = sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))
        text = b"".join(f.read_bytes() for f in files) + " ".join(FLAGS).encode()
        digest = hashlib.sha256(text).hexdigest()
        sources = [str(f) for f in files if f.suffix == ".cpp"]
        return load(f"omnistage_ar_native_{digest[:12]}", sources, extra_cflags=FLAGS, verbose=False)
    except Exception as exc:  # noqa: BLE001 - no compiler / ninja / headers: torch ops still work
        logger.warning("native AR kernels off, they did not build: %s", exc)
        return None


def can_decode(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether `paged_decode` takes this layer's decode queries: CPU, float32/bf16, head dim 16k ≤ 256."""
    dim = q.shape[-1]
    return (
        q.device.type == "cpu"
        and q.dtype in DTYPES
        and k_cache.dtype == q.dtype
        and dim % 16 == 0
        and dim <= 256
        and kernels() is not None
    )


def can_write_cache(new: torch.Tensor, cache: torch.Tensor) -> bool:
    """Whether `write_cache` takes these keys/values ([T, Hkv, D], each row's heads packed) for this cache."""
    return (
        new.device.type == "cpu"
        and new.dtype == cache.dtype
        and new.stride(2) == 1
        and new.stride(1) == new.shape[2]
        and kernels() is not None
    )


def write_cache(
    k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """k_cache[slots] = k and v_cache[slots] = v, one row copy each (index_copy_ costs ~20 µs a call here)."""
    kernels().write_cache(k_cache, v_cache, slots, k, v)


def paged_decode(
    out: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: torch.Tensor,
    slots: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> None:
    """out[rows[b]] = attention of q[rows[b]] over cache slots slots[b, :lens[b]] (q/out [T, Hq, D],
    caches [S, Hkv, D]), in float32 whatever the storage type."""
    kernels().paged_decode(out, q, k_cache, v_cache, rows, slots, lens, scale)


def main() -> int:
    """Builds the kernels now (set-up calls this); never fails set-up, only says what it found."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    built = kernels() is not None
    print(f"omnistage native AR kernels: {'built' if built else 'not used here (torch ops)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
