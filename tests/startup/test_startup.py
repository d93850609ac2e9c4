"""Bounded start-up: a stage that never becomes ready fails the start within its deadline, naming the stage,
the replica and what it was doing, and leaves no process and no shared memory behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from omnistage import AsyncOmni
from omnistage.errors import StartupTimeoutError
from omnistage.families.llm.tiny import tiny_llm_dir
from tests.reliability.leftovers import MARK_VARIABLE, new_mark, processes_marked, segments_of
from tests.startup.stuck_loader import LOCK_VARIABLE, doing_in
from tests.support.polling import wait_until
from tests.support.server_process import REPO, ServerProcess, free_port

pytestmark = pytest.mark.e2e
STUCK = "tests.startup.stuck_loader:wait_on_stale_lock"


def stuck_overrides(placement: str, timeout_s: float = 4) -> dict:
    return {
        "0": {"placement": placement, "startup_timeout_s": timeout_s, "engine_args": {"model_loader": STUCK}}
    }


@pytest.fixture
def stale_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    lock = tmp_path / "torch_extensions" / "omnistage_ar_native_13bb9a24c587" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    monkeypatch.setenv(LOCK_VARIABLE, str(lock))
    yield lock
    lock.unlink()  # lets an inline stage's thread, still waiting in this process, end


@pytest.mark.parametrize("placement", ["process", "inline"])
def test_serve_exits_non_zero_naming_the_stuck_stage(placement: str, stale_lock: Path) -> None:
    mark = new_mark()
    env = {**os.environ, "PYTHONPATH": str(REPO), MARK_VARIABLE: mark}
    command = [
        sys.executable,
        "-m",
        "omnistage",
        "serve",
        str(tiny_llm_dir("qwen2")),
        "--port",
        str(free_port()),
    ]
    # A deadline long enough for a stage to reach its loader on a quiet machine (imports take a few seconds),
    # so that the message usually shows the wait it is stuck in.
    command += ["--stage-overrides", json.dumps(stuck_overrides(placement, timeout_s=15))]
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=120)  # only bounds a broken test
    assert proc.returncode == 1, err[-3000:]
    message = err[err.index("omnistage serve:") :]
    assert "stage 0 (llm) replica 0" in message and "startup_timeout_s of 15 s" in message
    assert doing_in(message)  # what it was doing: its stack
    assert processes_marked(mark) == []  # the stage process is gone with the server
    assert segments_of(proc.pid) == []


async def test_async_omni_raises_the_same_error(stale_lock: Path) -> None:
    mark = new_mark()
    os.environ[MARK_VARIABLE] = mark  # inherited by the stage process only
    try:
        with pytest.raises(StartupTimeoutError, match=r"stage 0 \(llm\) replica 0.*startup_timeout_s of 3 s"):
            AsyncOmni(str(tiny_llm_dir("qwen2")), stage_overrides=stuck_overrides("process", 3))
    finally:
        del os.environ[MARK_VARIABLE]
    wait_until(lambda: processes_marked(mark) == [], 30, "the stage process gone")
    assert segments_of(os.getpid()) == []


async def test_the_api_deadline_overrides_every_stage(stale_lock: Path) -> None:
    overrides = stuck_overrides("inline", timeout_s=600)
    del overrides["0"]["startup_timeout_s"]
    with pytest.raises(StartupTimeoutError, match=r"(?s)startup_timeout_s of 2 s.*wait_on_stale_lock"):
        AsyncOmni(str(tiny_llm_dir("qwen2")), stage_overrides=overrides, startup_timeout=2)


def test_a_server_fixture_that_times_out_shows_what_its_stages_are_doing(stale_lock: Path, tmp_path: Path):
    """A server whose stage never gets ready: the fixture's timeout error carries the stage's stack."""
    overrides = stuck_overrides("process", timeout_s=600)
    args = ["serve", str(tiny_llm_dir("qwen2")), "--stage-overrides", json.dumps(overrides)]
    server = ServerProcess(args, tmp_path / "server.log", module="omnistage")
    try:
        with pytest.raises(TimeoutError) as failed:
            server.wait_healthy(timeout=20)  # the stage reaches its loader within a few seconds
    finally:
        server.stop()
    report = str(failed.value)
    assert "--- server log ---" in report and "stage-0-0.log ---" in report
    assert doing_in(report)


HANGING_TEST = """
import threading, time
import pytest

@pytest.mark.timeout(2)
def test_hangs():
    threading.Thread(target=lambda: time.sleep(600), name="helper", daemon=True).start()
    threading.Event().wait()
"""


def test_a_hanging_test_fails_with_every_threads_stack(tmp_path: Path) -> None:
    """The suite's settings (pyproject.toml): a test past its budget fails, showing all threads, and the
    run goes on to its end."""
    planted = tmp_path / "test_planted.py"
    planted.write_text(HANGING_TEST)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        str(REPO / "pyproject.toml"),
    ]
    done = subprocess.run(
        [*command, "--rootdir", str(tmp_path), str(planted)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1, done.stdout[-2000:]
    assert "Timeout (>2.0s) from pytest-timeout" in done.stdout and "1 failed" in done.stdout
    assert "Stack of helper" in done.stdout and ">       threading.Event().wait()" in done.stdout  # both
