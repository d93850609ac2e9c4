"""A real server process for end-to-end tests: started on a free port, waited on, stopped with SIGTERM.

It leads its own process group, as a server started from a shell or by a service manager does, so a test
can signal the group the way a terminal's Ctrl-C or `systemctl stop` would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`python -m tests.serving.launch` (toy pipelines) or `python -m omnistage serve` (model dirs)."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        *,
        module: str = "tests.serving.launch",
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
            raise TimeoutError(f"{exc}:\n{self.logs()}") from None

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
