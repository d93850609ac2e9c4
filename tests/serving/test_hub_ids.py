"""Models named by hub id ("ORG/NAME"), resolved from the local Hugging Face cache without the network: a
snapshot laid out as huggingface_hub lays it out (`models--ORG--NAME/snapshots/<commit>/`, `refs/main`) is
served by `omnistage serve ORG/NAME` under that name; an id the cache lacks is an error naming where it
looked."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from omnistage.errors import ConfigError
from omnistage.families.llm.tiny import tiny_llm_dir
from omnistage.families.resolve import resolve_pipeline
from tests.support.server_process import ServerProcess

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_layout(root: Path, repo: str, source: Path) -> Path:
    """`source`'s files as the snapshot of `repo` in a hub cache at `root`."""
    folder = root / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, folder / "snapshots" / COMMIT)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    return folder / "snapshots" / COMMIT


def test_a_hub_id_resolves_from_the_cache_and_a_missing_one_names_it(tmp_path, monkeypatch) -> None:
    snapshot = hub_layout(tmp_path / "hub", "tiny-org/tiny-chat", tiny_llm_dir())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec, info = resolve_pipeline("tiny-org/tiny-chat")
    assert spec.name == "llm" and info.path == snapshot.resolve()
    with pytest.raises(ConfigError) as missing:
        resolve_pipeline("tiny-org/absent")
    assert str(tmp_path / "hub" / "models--tiny-org--absent") in str(missing.value)
    assert "never downloads" in str(missing.value)


@pytest.mark.engine
def test_serve_a_hub_id(tmp_path) -> None:
    hub_layout(tmp_path / "hub", "tiny-org/tiny-chat", tiny_llm_dir())
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    server = ServerProcess(
        ["serve", "tiny-org/tiny-chat"], tmp_path / "server.log", module="omnistage", env=env
    )
    try:
        server.wait_healthy(timeout=300)
        with httpx.Client(base_url=server.url, timeout=120) as http:
            assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["tiny-org/tiny-chat"]
            body = {"model": "tiny-org/tiny-chat", "prompt": "Hello", "max_tokens": 4, "temperature": 0}
            reply = http.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 4
    finally:
        server.stop()
