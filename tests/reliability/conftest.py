"""The demo set served for the fault and abuse suite, with short slow-client deadlines and a low WebSocket
event rate so the tests reach them, and helpers that read what the server holds.

Every stage runs in its own process, so a test can kill one; the server and its stages carry a marker in
their environment, so the suite can tell that nothing of them is left once the server has stopped."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.leftovers import MARK_VARIABLE, new_mark, processes_marked, segments_of
from tests.support.polling import wait_until
from tests.support.server_process import ServerProcess, children

CHAT = "smollm2-135m-instruct"
VOICE = "hibari-en"
SHAPES = "wan-shapes"
WHISPER = "whisper-tiny.en"
SEND_TIMEOUT_S = 3
BODY_TIMEOUT_S = 3
WS_EVENTS_PER_S = 100
KV_CACHE_BYTES = 256 * 2**20


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from omnistage.demo import demo_model_dirs

    root = tmp_path_factory.mktemp("reliability-server")
    args = ["serve", *map(str, demo_model_dirs()), "--num-threads", "1"]
    args += ["--storage-dir", str(root / "storage"), "--voices-dir", str(root / "voices")]
    args += ["--send-timeout", str(SEND_TIMEOUT_S), "--request-body-timeout", str(BODY_TIMEOUT_S)]
    args += ["--max-ws-events-per-second", str(WS_EVENTS_PER_S)]
    # The AR stages' KV pools are allocated untouched and committed block by block as the prefix cache cycles
    # through them (2.4 GB each by default here): a bounded pool keeps the soak's RSS about leaks, not that.
    args += ["--kv-cache-bytes", str(KV_CACHE_BYTES)]
    mark = new_mark()
    server = ServerProcess(args, root / "server.log", module="omnistage", env={MARK_VARIABLE: mark})
    try:
        server.wait_healthy(timeout=240)
        yield server
    finally:
        server.stop()
    # Nothing of the server outlives it: no stage process, no shared-memory segment.
    wait_until(lambda: processes_marked(mark) == [], 30, "every process of the server gone")
    assert segments_of(server.proc.pid) == []


@pytest.fixture
def http(demo_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=demo_server.url, timeout=120) as client:
        yield client


def replicas(url: str) -> dict[tuple[str, int, int], dict]:
    """(model, stage id, replica) -> its /health entry (pid, alive, ready, load)."""
    health = httpx.get(url + "/health", timeout=30).json()
    return {
        (model, stage["stage_id"], r["replica"]): r
        for model, entry in health["models"].items()
        for stage in entry["stages"]
        for r in stage["replicas"]
    }


def engine_requests(url: str) -> dict[tuple[str, str, str], float]:
    """(model, stage, replica) -> requests its engine holds (the stages' own count, from /metrics)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    pattern = (
        r'omnistage_stage_requests\{model="([^"]+)",replica="(\d+)",stage="(\d+)",stage_name="[^"]*"\} (\S+)'
    )
    return {(m, s, r): float(v) for m, r, s, v in re.findall(pattern, text)}


def held(url: str) -> list[str]:
    """Every place that still holds a request: a replica's load in the orchestrator, or an engine."""
    loads = [f"{key} load {r['load']}" for key, r in replicas(url).items() if r["load"]]
    engines = [f"{key} holds {n:g}" for key, n in engine_requests(url).items() if n]
    return loads + engines


def wait_all_free(url: str, what: str) -> None:
    wait_until(lambda: not held(url), 60, f"{what}: every stage free (held: {held(url)})")


def wait_serving(url: str, key: tuple[str, int, int], old_pid: int) -> int:
    """Until the replica runs again in a new process and the server is healthy; its new pid."""

    def back() -> int | None:
        r = replicas(url)[key]
        healthy = httpx.get(url + "/health", timeout=30).status_code == 200
        return r["pid"] if healthy and r["alive"] and r["ready"] and r["pid"] != old_pid else None

    return wait_until(back, 120, f"{key} restarted")


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        total += int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024
    return total


def server_pids(server: ServerProcess) -> list[int]:
    return [server.proc.pid, *children(server.proc.pid)]
