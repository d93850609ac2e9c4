"""The native kernels are built once per install, never at serve time (native.py).

Serving runs with a toolchain on PATH that only records that it was called, and with stale lock files
planted in every folder a build could use: a stage process either loads the install's built library or,
where there is none, runs on torch ops; it never calls a compiler, never creates or waits on a lock, and
gives the same greedy tokens either way."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from omnistage.families.llm.tiny import tiny_llm_dir
from omnistage.stages.ar.cpu import native

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
TOOLS = ("c++", "g++", "gcc", "cc", "clang", "clang++", "ninja", "ld", "x86_64-linux-gnu-g++")

# One request through a stage process (the placement `omnistage serve` uses), then its engine's stats.
SERVE = """
import json, sys
from omnistage import Omni, SamplingParams
from omnistage.stages.ar.cpu import native
with Omni(sys.argv[1], stage_overrides={"0": {"placement": "process"}}) as omni:
    (out,) = omni.generate([[1, 2, 3, 4, 5]], SamplingParams(max_tokens=6, temperature=0))
    (stage,) = omni.stats()["stages"]
native_kernels, weight_only = stage["result"]["native_kernels"], native.weight_only_kernels() is not None
print(json.dumps({"tokens": out.token_ids, "native": native_kernels, "weight_only": weight_only}))
"""


def recording_toolchain(folder: Path, calls: Path) -> Path:
    """Executables named like every compiler and build tool, which record the call and fail."""
    folder.mkdir()
    for tool in TOOLS:
        script = folder / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\nexit 1\n')
        script.chmod(0o755)
    return folder


def plant_stale_locks(*folders: Path) -> list[Path]:
    """torch's FileBaton lock (a compile killed part-way leaves it), in the old JIT cache layout and here."""
    locks = []
    for folder in folders:
        for sub in ("", "py311_cpu/omnistage_ar_native_13bb9a24c587"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
            locks.append(folder / sub / "lock")
            locks[-1].write_text("")
    return locks


def serve_once(tmp_path: Path, native_dir: Path) -> dict:
    calls = tmp_path / "compiler-calls.txt"
    tools = recording_toolchain(tmp_path / "bin", calls)
    extensions = tmp_path / "torch_extensions"
    locks = plant_stale_locks(extensions, native_dir)
    before = {p for p in [*extensions.rglob("*"), *native_dir.rglob("*")]}
    env = {
        **os.environ,
        "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
        "CXX": str(tools / "c++"),
        "TORCH_EXTENSIONS_DIR": str(extensions),
        native.DIR_VARIABLE: str(native_dir),
        "PYTHONPATH": str(REPO),
    }
    env.pop(native.SWITCH, None)
    done = subprocess.run(
        [sys.executable, "-c", SERVE, str(tiny_llm_dir("qwen2"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert not calls.exists(), f"serving called a build tool: {calls.read_text()}"
    after = {p for p in [*extensions.rglob("*"), *native_dir.rglob("*")]}
    assert after == before, f"serving wrote into a build folder: {sorted(map(str, after - before))}"
    assert all(lock.exists() for lock in locks)  # untouched, and nobody waited on them
    return json.loads(done.stdout.strip().splitlines()[-1])


HERE = [library for library in native.LIBRARIES if library.runs_here()]


def test_a_stage_loads_the_installs_build_and_never_compiles(tmp_path: Path) -> None:
    """With the install's libraries (where any runs on this CPU) and with none built: the same tokens,
    torch ops where nothing is built, and no compiler either way."""
    if not HERE:
        result = serve_once(tmp_path, tmp_path / "empty-build")
        assert result["native"] is False and result["weight_only"] is False and len(result["tokens"]) == 6
        return
    install = tmp_path / "install-build"
    install.mkdir()
    for library in HERE:
        built = library.path()
        assert built.is_file(), "set-up builds the kernels (python -m omnistage.stages.ar.cpu.native)"
        shutil.copy2(built, install / built.name)
    with_kernels = serve_once(tmp_path, install)
    assert with_kernels["native"] is (native.DECODER in HERE)
    assert with_kernels["weight_only"] is (native.WEIGHT_ONLY in HERE)
    without = tmp_path / "without"
    without.mkdir()
    shutil.rmtree(tmp_path / "bin")
    (tmp_path / "compiler-calls.txt").unlink(missing_ok=True)
    on_torch_ops = serve_once(tmp_path, without / "nothing-built")
    assert on_torch_ops["native"] is False and on_torch_ops["weight_only"] is False
    assert on_torch_ops["tokens"] == with_kernels["tokens"] and len(with_kernels["tokens"]) == 6


def test_two_installs_keep_separate_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's name is keyed by what changes it, and its folder is the install's own."""
    monkeypatch.setenv(native.DIR_VARIABLE, str(tmp_path / "a"))
    first = native.DECODER.path()
    monkeypatch.setenv(native.DIR_VARIABLE, str(tmp_path / "b"))
    second = native.DECODER.path()
    assert first.parent != second.parent and first.name == second.name
    monkeypatch.delenv(native.DIR_VARIABLE)
    assert native.library_dir() == Path(native.__file__).with_name("build")
    other = dataclasses.replace(native.DECODER, flags=(*native.DECODER.flags, "-DOTHER"))
    assert other.path().name != first.name  # other flags: another library, never a rebuild in place
    assert native.WEIGHT_ONLY.path().name.startswith("omnistage_ar_weight_only-")
