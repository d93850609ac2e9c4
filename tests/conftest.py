"""Suite-wide settings and the one server several areas share (area fixtures: tests/<area>/conftest.py)."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# Keep the suite within its time budget on 2 cores and independent of the caller's environment.
os.environ.setdefault("OMNISTAGE_LOG_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices")


@pytest.fixture(scope="session")
def voice_demo_server(tmp_path_factory: pytest.TempPathFactory, voices_dir: Path) -> Iterator:
    """tests/voice_demo.py: the speaking and listening demo models, one server for the session."""
    from tests.serving.server_process import ServerProcess
    from tests.voice_demo import voice_demo_args

    root = tmp_path_factory.mktemp("voice-demo-server")
    server = ServerProcess(
        voice_demo_args(voices_dir, root / "storage"), root / "server.log", module="omnistage"
    )
    try:
        server.wait_healthy(timeout=300)
        yield server
    finally:
        server.stop()
