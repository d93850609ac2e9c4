"""Where built checkpoints live. Builders are deterministic, so a directory keyed by (name, version) is
built once per machine and reused by tests, benchmarks and the demo server."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    root = os.environ.get("OMNISTAGE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "omnistage"
    )
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_dir(name: str, version: str, build: Callable[[Path], None]) -> Path:
    """`cache_root()/models/<name>-<version>`, calling `build(tmp_dir)` first if it is absent.

    Safe under concurrency (a file lock; the directory appears atomically once complete), so parallel
    test processes never see a half-written checkpoint.
    """
    target = cache_root() / "models" / f"{name}-{version}"
    if (target / ".complete").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            build(tmp)
            (tmp / ".complete").write_text("ok\n")
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target
