"""A real server process for end-to-end tests: started on a free port, waited on, stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`python -m tests.serving.launch` (toy pipelines) or `python -m omnistage serve` (model dirs)."""

    def __init__(self, args: list[str], log_path: Path, *, module: str = "tests.serving.launch"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMNISTAGE_LOG_LEVEL": "WARNING"}
        command = [sys.executable, "-m", module, *args, "--port", str(self.port)]
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not healthy after {timeout}s:\n{self.logs()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
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
