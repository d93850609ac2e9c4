"""The AR engine's native CPU kernels (csrc/): built once per install by set-up, only loaded at serve time.

On a 2-core Xeon a decode step of 32 sequences spent about a quarter of its time in attention: gathering each
sequence's keys and values out of the paged cache into padded copies, then SDPA on many tiny problems. The
decode kernel (paged_decode.cpp) reads the cache rows in place and does all of a sequence's heads in one
task (the engine's decode steps were 8-13% faster with it, benchmarks/RESULTS.md). The pointwise kernels
(decoder_pointwise.cpp: RMS norm with its residual add, rotary embedding, SiLU-times-up) replace some thirty
tiny torch ops per layer with four calls, and `write_cache` puts a step's keys and values into their slots.
They are built for AVX-512 or AVX2 (`DECODER`: this CPU's); the weight-only quantized linears
(csrc/weight_only/, `WEIGHT_ONLY`) are a library of their own.

Why a build step of our own rather than `torch.utils.cpp_extension.load`: that JIT-builds into one user-wide
cache keyed by the sources only, so two installs on one machine rebuilt each other's library inside stage
processes at serve time, and a compile killed part-way left torch's lock file behind, on which every later
stage start waited forever. Here `make setup` (`python -m omnistage.stages.ar.cpu.native`) compiles the
libraries into this install's build folder, under a name keyed by everything that changes it (sources, flags,
torch, Python ABI, CPU capability); the compiler writes a temporary file that is renamed into place, so no
lock is needed. At serve time `kernels()` only loads that file: where it is missing or does not load, the
engine says why once and stays on torch ops (SDPA for attention). It never compiles and never waits.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import shlex
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SWITCH = "OMNISTAGE_NATIVE_KERNELS"  # "0": torch ops only
DIR_VARIABLE = "OMNISTAGE_NATIVE_DIR"  # where the built libraries live (default: this package's build/)
BUILD_TIMEOUT_S = 900.0
DTYPES = (torch.float32, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Library:
    """One native library: the sources in `folder` (its .cpp files and headers, not its subfolders), the
    flags they compile with, and the CPUs it runs on (torch's `get_cpu_capability()` names)."""

    module: str
    folder: Path
    flags: tuple[str, ...]
    runs_on: tuple[str, ...]

    def sources(self, with_headers: bool = False) -> list[Path]:
        files = sorted(self.folder.glob("*.cpp"))
        return files + sorted(self.folder.glob("*.h")) if with_headers else files

    def key(self) -> str:
        """Everything that changes the library, without running a compiler (serve time must not)."""
        parts = [
            *(f.name.encode() + f.read_bytes() for f in self.sources(with_headers=True)),
            " ".join(self.flags).encode(),
            torch.__version__.encode(),
            str(torch.version.git_version).encode(),
            str(sysconfig.get_config_var("EXT_SUFFIX")).encode(),
            platform.machine().encode(),
            torch.backends.cpu.get_cpu_capability().encode(),
        ]
        return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]

    def path(self) -> Path:
        return library_dir() / f"{self.module}-{self.key()}{sysconfig.get_config_var('EXT_SUFFIX')}"

    def runs_here(self) -> bool:
        return torch.backends.cpu.get_cpu_capability() in self.runs_on


# The decoder's attention and pointwise kernels, written once over 16 float lanes (csrc/vec16.h) and built
# for AVX-512 (one register) or AVX2 (two); no FMA contraction: the pointwise kernels round like the torch
# ops they replace.
_DECODER_FLAGS = ("-O3", "-fopenmp", "-ffp-contract=off")
DECODER_AVX512 = Library(
    "omnistage_ar_native",
    CSRC,
    (*_DECODER_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mfma"),
    ("AVX512",),
)
DECODER_AVX2 = Library("omnistage_ar_native_avx2", CSRC, (*_DECODER_FLAGS, "-mavx2", "-mfma"), ("AVX2",))
DECODER = DECODER_AVX512 if DECODER_AVX512.runs_here() else DECODER_AVX2  # this CPU's
# Weight-only quantized linears (quantized_linear.py), AVX2 so that every x86 CPU of the last decade has them.
WEIGHT_ONLY = Library(
    "omnistage_ar_weight_only",
    CSRC / "weight_only",
    ("-O3", "-fopenmp", "-mavx2", "-mfma"),
    ("AVX2", "AVX512"),
)
LIBRARIES = (DECODER_AVX512, DECODER_AVX2, WEIGHT_ONLY)


def library_dir() -> Path:
    """This install's folder of built kernels: inside the package (a clone's source tree when installed
    editable, site-packages otherwise), so two installs never share one."""
    configured = os.environ.get(DIR_VARIABLE)
    return Path(configured) if configured else Path(__file__).with_name("build")


def kernels() -> Any | None:
    """The decoder kernels (attention, pointwise), or None (the reason logged once) where not usable here."""
    return loaded(DECODER)


def weight_only_kernels() -> Any | None:
    """The weight-only linears' kernels, or None where not usable here."""
    return loaded(WEIGHT_ONLY)


@functools.cache
def loaded(library: Library) -> Any | None:
    """`library`'s built module, or None (the reason logged once) where it cannot be used here."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    if not library.runs_here():
        capability = torch.backends.cpu.get_cpu_capability()
        logger.info(
            "native kernels %s off: they need %s, this CPU is %s", library.module, library.runs_on, capability
        )
        return None
    path = library.path()
    if not path.is_file():
        logger.warning(
            "native kernels %s off: none built for this install (%s); `make setup` or "
            "`python -m omnistage.stages.ar.cpu.native` builds them",
            library.module,
            path,
        )
        return None
    try:
        return _load(library.module, path)
    except Exception as exc:  # noqa: BLE001 - a library that does not load here: torch ops still work
        logger.warning("native kernels %s off: %s did not load: %s", library.module, path, exc)
        return None


def _load(module_name: str, path: Path) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(module_name, str(path))
    spec = importlib.util.spec_from_file_location(module_name, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def compile_command(library: Library, objects: list[Path], output: Path) -> list[list[str]]:
    """The compiler and linker commands (what cpp_extension would run, without its cache and lock)."""
    from torch.utils import cpp_extension

    cxx = shlex.split(os.environ.get("CXX", "c++"))
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    cflags = [
        f"-DTORCH_EXTENSION_NAME={library.module}",
        "-DTORCH_API_INCLUDE_EXTENSION_H",
        *(arg for inc in includes for arg in ("-isystem", inc)),
        *("-fPIC", "-std=c++20", *library.flags),
    ]
    libs = cpp_extension.library_paths()
    ldflags = ["-shared", *(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs)]
    ldflags += ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python", "-fopenmp"]
    sources = library.sources()
    compiles = [[*cxx, *cflags, "-c", str(s), "-o", str(o)] for s, o in zip(sources, objects, strict=True)]
    return [*compiles, [*cxx, *map(str, objects), *ldflags, "-o", str(output)]]


def build(library: Library = DECODER, timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """Compile `library` into its `path()` (nothing to do if it is there). The link writes a temporary file
    that is renamed into place: a build killed part-way leaves no library and no lock, and two builds at once
    each finish with the same file."""
    target = library.path()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        objects = [Path(tmp) / f"{s.stem}.o" for s in library.sources()]
        partial = Path(tmp) / target.name
        *compiles, link = compile_command(library, objects, partial)
        with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
            list(pool.map(lambda cmd: _run(cmd, timeout_s), compiles))
        _run(link, timeout_s)
        os.replace(partial, target)
    for old in target.parent.glob(f"{library.module}-*"):  # earlier sources' builds of this install
        if old != target:
            old.unlink(missing_ok=True)
    return target


def _run(command: list[str], timeout_s: float) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(command[:2])} ... failed:\n{done.stderr[-4000:]}")


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
    """Set-up's build step. It never fails set-up: where a library cannot be built (another CPU, no
    compiler), it says why and the engine runs on torch ops."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    capability = torch.backends.cpu.get_cpu_capability()
    for library in LIBRARIES:
        if not library.runs_here():
            need = "/".join(library.runs_on)
            print(f"omnistage native kernels {library.module}: not used here (need {need}, not {capability})")
            continue
        try:
            path = build(library)
        except Exception as exc:  # noqa: BLE001 - no compiler, headers or time: torch ops still work
            print(f"omnistage native kernels {library.module}: not built ({exc}); torch ops")
            continue
        note = "" if loaded(library) is not None else " (it does not load: torch ops)"
        print(f"omnistage native kernels {library.module}: built, {path}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
