"""An `omnistage serve` process for benchmarks that drive a server: started, waited on, stopped.

Imported by the benchmark scripts beside it (`python benchmarks/X.py` puts this folder on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def start_server(
    model: str | list[str], port: int, extra: list[str], timeout_s: float = 600
) -> subprocess.Popen:
    """`omnistage serve MODEL... --port PORT EXTRA...`, returned once `/health` answers 200."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMNISTAGE_LOG_LEVEL": "WARNING"}
    models = [model] if isinstance(model, str) else list(model)
    command = [sys.executable, "-m", "omnistage", "serve", *models, "--port", str(port), *extra]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return wait_ready(proc, f"http://127.0.0.1:{port}/health", timeout_s)


def wait_ready(proc: subprocess.Popen, url: str, timeout_s: float) -> subprocess.Popen:
    """`proc` once `url` answers 200; SystemExit if it exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[:4]} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    raise SystemExit(f"{proc.args[:4]} did not answer {url}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(60)
