"""A real server process for end-to-end tests: started on a free port, waited on, stopped with SIGTERM.

It leads its own process group, as a server started from a shell or by a service manager does, so a test
can signal the group the way a terminal's Ctrl-C or `systemctl stop` would."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from tests.support.polling import wait_until

REPO = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (stage processes are the server's children)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def stage_logs(server_pid: int) -> list[Path]:
    """The logs of the stage processes a server started (their configs name the server as owner)."""
    logs = []
    for config in Path(tempfile.gettempdir()).glob("omnistage-*/stage-*.json"):
        with contextlib.suppress(OSError, ValueError):
            if json.loads(config.read_text()).get("owner_pid") == server_pid:
                logs.append(config.with_suffix(".log"))
    return [log for log in logs if log.exists()]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`python -m tests.support.launch` (toy pipelines) or `python -m omnistage serve` (model dirs)."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        *,
        module: str = "tests.support.launch",
        env: dict | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMNISTAGE_LOG_LEVEL": "WARNING", **(env or {})}
        command = [sys.executable, "-m", module, *args, "--port", str(self.port)]
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout: float = 120.0) -> None:
        try:
            wait_until(self.healthy, timeout, "server healthy")
        except AssertionError as exc:
            raise TimeoutError(f"{exc}:\n{self.diagnostics()}") from None
        except BaseException:  # the test's own budget ran out (pytest-timeout): say why before failing
            print(f"server {self.url} not healthy yet:\n{self.diagnostics()}")
            raise

    def diagnostics(self) -> str:
        """The server's and its stage processes' stacks (they dump them on SIGUSR1) and the ends of their
        logs: what a server that is not healthy is waiting for."""
        stages = stage_logs(self.proc.pid)
        for pid in [self.proc.pid, *children(self.proc.pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        with contextlib.suppress(AssertionError):  # the dumps are written in one go each
            sizes = {p: p.stat().st_size for p in stages}
            wait_until(lambda: all(p.stat().st_size > n for p, n in sizes.items()), 3, "stacks dumped")
        parts = [f"--- server log ---\n{self.logs()}"]
        parts += [f"--- {p} ---\n{p.read_text(errors='replace')[-4000:]}" for p in stages]
        return "\n".join(parts)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0, group: bool = False) -> int:
        """Signal the server (`group`: its whole process group) and wait for it to exit."""
        if self.proc.poll() is None:
            if group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def logs(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()[-5000:]


def toy_server_args(
    models: str,
    *,
    storage_dir: Path,
    api_key: str | None = None,
    stage_overrides: dict | None = None,
    extra: list[str] = (),
) -> list[str]:
    args = ["--models", models, "--storage-dir", str(storage_dir)]
    if api_key:
        args += ["--api-key", api_key]
    if stage_overrides:
        args += ["--stage-overrides", json.dumps(stage_overrides)]
    return args + list(extra)
