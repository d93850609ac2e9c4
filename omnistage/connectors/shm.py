"""Shared-memory connector: each payload is one POSIX shared-memory segment.

Segments are named `omnistage_<owner pid>_<id>`, so one left behind by a killed process is found and
removed by the next start (`sweep_stale_segments`). A segment is unlinked by the receiver once read (when
the reference says it owns it) and, in any case, by the orchestrator when the request ends.

A payload is written and read once, so it goes through the segment's file in /dev/shm (what `shm_open`
opens) with one `write` and one `readv` (into the buffer the value then owns: one copy, not two), not
through `multiprocessing.shared_memory`: that maps the segment and, on Python 3.11, registers it with a
resource tracker process on every open, which each side then had to unregister again.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from pathlib import Path
from typing import Any

from omnistage.connectors.base import TensorRef, decode_payload, encode_payload

PREFIX = "omnistage_"
SHM_DIR = Path("/dev/shm")
START_MARGIN_S = 1.0  # a segment this much older than its named owner's start is a predecessor's


class ShmConnector:
    name = "shm"

    def __init__(self, owner_pid: int | None = None):
        self.owner_pid = owner_pid or os.getpid()
        self.stats = {"put_bytes": 0, "puts": 0, "put_s": 0.0, "get_bytes": 0, "gets": 0, "get_s": 0.0}

    def put(self, obj: Any) -> TensorRef:
        t0 = time.perf_counter()
        ref, data = encode_payload(obj)
        key = f"{PREFIX}{self.owner_pid}_{uuid.uuid4().hex[:16]}"
        fd = os.open(_path(key), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            written = 0
            while written < ref.nbytes:
                written += os.write(fd, data[written:])
        finally:
            os.close(fd)
        self.stats["puts"] += 1
        self.stats["put_bytes"] += ref.nbytes
        self.stats["put_s"] += time.perf_counter() - t0
        return TensorRef(
            ref.kind, ref.dtype, ref.shape, ref.nbytes, key=key, mode=ref.mode, created=ref.created
        )

    def get(self, ref: TensorRef, release_after: bool | None = None) -> Any:
        """Read a payload (a copy). The segment is unlinked afterwards if the reference owns it."""
        t0 = time.perf_counter()
        buffer = bytearray(ref.nbytes)
        fd = os.open(_path(ref.key), os.O_RDONLY)  # FileNotFoundError: the payload is gone
        try:
            view, read = memoryview(buffer), 0
            while read < ref.nbytes:
                got = os.readv(fd, [view[read:]])
                if not got:
                    raise FileNotFoundError(f"shared-memory segment {ref.key} ended after {read} bytes")
                read += got
        finally:
            os.close(fd)
        value = decode_payload(ref, buffer, owned=True)
        if ref.owned if release_after is None else release_after:
            release(ref.key)
        self.stats["gets"] += 1
        self.stats["get_bytes"] += ref.nbytes
        self.stats["get_s"] += time.perf_counter() - t0
        return value


def _path(key: str) -> str:
    return f"{SHM_DIR}/{key}"  # a str: pathlib's joins cost more than the small payloads' reads


def release(key: str) -> None:
    """Unlink a segment; a segment already gone is fine (it was consumed)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_path(key))


def live_segments(owner_pid: int | None = None) -> list[str]:
    pattern = f"{PREFIX}{owner_pid}_*" if owner_pid else f"{PREFIX}*"
    return sorted(p.name for p in SHM_DIR.glob(pattern))


def sweep_stale_segments() -> int:
    """Remove segments whose owner process is gone (left by a killed server), including those named after a
    pid a newer process has since been given: a segment written before its named owner started is a dead
    predecessor's (pids wrap at 32768 in many containers, so a server can inherit a killed one's pid)."""
    removed = 0
    for name in live_segments():
        try:
            pid = int(name[len(PREFIX) :].split("_", 1)[0])
        except ValueError:
            continue
        started = process_start_time(pid)
        try:
            stale = started is None or os.stat(_path(name)).st_mtime < started - START_MARGIN_S
        except FileNotFoundError:
            continue  # released meanwhile
        if stale:
            release(name)
            removed += 1
    return removed


def process_start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch, to a clock tick), or None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    ticks = int(stat[stat.rindex(")") + 2 :].split()[19])  # field 22, starttime, after "pid (comm) "
    return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0
