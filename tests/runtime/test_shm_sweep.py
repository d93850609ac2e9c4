"""Stale shared-memory segments are swept at start: those of a process that is gone, and those named after
a pid that a newer process has since been given (written before that process started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omnistage.connectors.shm import (
    PREFIX,
    SHM_DIR,
    live_segments,
    process_start_time,
    release,
    sweep_stale_segments,
)

pytestmark = pytest.mark.unit


def segment(pid: int, tag: str, mtime: float | None = None) -> str:
    name = f"{PREFIX}{pid}_{tag}"
    (SHM_DIR / name).write_bytes(b"payload")
    if mtime is not None:
        os.utime(SHM_DIR / name, (mtime, mtime))
    return name


def test_segments_of_gone_and_of_earlier_holders_of_a_pid_are_swept() -> None:
    dead_pid = next(pid for pid in range(32767, 300, -1) if not Path(f"/proc/{pid}").exists())  # none
    started = process_start_time(os.getpid())
    assert started is not None and process_start_time(dead_pid) is None
    names = {
        "dead owner": segment(dead_pid, "deadbeef"),
        "earlier holder of this pid": segment(os.getpid(), "0ld0ld", mtime=started - 600),
        "this process's own": segment(os.getpid(), "f00d"),
    }
    try:
        sweep_stale_segments()
        left = set(live_segments())
        assert names["dead owner"] not in left
        assert names["earlier holder of this pid"] not in left
        assert names["this process's own"] in left
    finally:
        for name in names.values():
            release(name)
