"""What a server or runtime may leave behind: processes (found by a marker in their environment, which stage
processes inherit) and shared-memory segments (named by their owner's pid, connectors/shm.py)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

MARK_VARIABLE = "OMNISTAGE_TEST_MARK"


def new_mark() -> str:
    return uuid.uuid4().hex


def processes_marked(mark: str) -> list[int]:
    """Live processes whose environment carries `mark` (zombies have no environment left to read)."""
    needle = f"{MARK_VARIABLE}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def segments_of(pid: int) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"omnistage_{pid}_*"))


def describe_segments(names: list[str]) -> str:
    """Each segment's size and age (what a leak report needs to tell whose payloads they were)."""
    import time

    found = []
    for name in names:
        try:
            stat = (Path("/dev/shm") / name).stat()
        except OSError:
            continue  # freed since
        found.append(f"{name}: {stat.st_size} bytes, {time.time() - stat.st_mtime:.0f} s old")
    return "; ".join(found) or "none left"
