"""A model served by the real app in the test's own process (its stages inline), for tests that talk to
the server through a client but need neither a server process nor its start-up time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from omnistage import AsyncOmni
from omnistage.serving.app import create_app
from omnistage.serving.settings import ServerSettings


def served(model_dir: Any, name: str, storage: Path, **settings: Any) -> Iterator[TestClient]:
    """The model on the server's app as `name`; `settings` are ServerSettings fields."""
    omni = AsyncOmni(str(model_dir), placement="inline")
    try:
        app = create_app({name: omni}, ServerSettings(storage_dir=storage, **settings))
        with TestClient(app) as client:
            yield client
    finally:
        omni._close()
