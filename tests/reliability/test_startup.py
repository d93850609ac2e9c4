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
from omnistage.demo.llm import tiny_llm_dir
from omnistage.errors import StartupTimeoutError
from tests.polling import wait_until
from tests.reliability.leftovers import MARK_VARIABLE, new_mark, processes_marked, segments_of
from tests.reliability.stuck_loader import LOCK_VARIABLE
from tests.serving.server_process import REPO, free_port

pytestmark = pytest.mark.e2e
STUCK = "tests.reliability.stuck_loader:wait_on_stale_lock"


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
    # A deadline long enough for the stage to reach its loader (imports take a few seconds), so that the
    # message shows the wait it is stuck in.
    command += ["--stage-overrides", json.dumps(stuck_overrides(placement, timeout_s=15))]
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=120)  # only bounds a broken test
    assert proc.returncode == 1, err[-3000:]
    message = err[err.index("omnistage serve:") :]
    assert "stage 0 (llm) replica 0" in message and "startup_timeout_s of 15 s" in message
    assert "wait_on_stale_lock" in message and "file_baton" in message  # what it was doing: its stack
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
