"""Fixtures for the server tests: one toy-pipeline server process shared by the e2e modules."""

from __future__ import annotations

import pytest

from tests.support.server_process import ServerProcess, toy_server_args

API_KEY = "test-key"
MAX_IMAGE_PIXELS = 64 * 64


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="session")
def gates(tmp_path_factory):
    """Where tests open the gates of the requests they hold in flight (`HOLD:<name>` in a toy prompt)."""
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="session")
def server(tmp_path_factory, media_dir, gates):
    """User pipelines of small torch modules (toy-omni: text + speech, toy-image, toy-video) and real tiny
    diffusers checkpoints on the diffusion engine (tiny-flux1, tiny-wan21-t2v, tiny-stable-audio), one server,
    an API key."""
    root = tmp_path_factory.mktemp("server")
    args = toy_server_args(
        "toy-omni,toy-image,toy-video,tiny-flux1,tiny-wan21-t2v,tiny-stable-audio",
        storage_dir=root / "storage",
        api_key=API_KEY,
        extra=[
            "--toy-gate-dir",
            str(gates),
            "--max-queued-requests",
            "6",
            "--max-image-pixels",
            str(MAX_IMAGE_PIXELS),
            "--max-request-bytes",
            str(2 * 1024 * 1024),
            "--allowed-local-media-path",
            str(media_dir),
        ],
    )
    proc = ServerProcess(args, root / "server.log")
    try:
        proc.wait_healthy(timeout=300)
        yield proc
    finally:
        code = proc.stop()
        assert code == 0, f"server did not shut down cleanly ({code}):\n{proc.logs()}"


@pytest.fixture(scope="session")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        yield c


class Reference:
    """The same toy pipelines run offline (`Omni`, inline): what the server must return."""

    def __init__(self) -> None:
        self._omnis: dict = {}

    def run(self, name: str, prompt, params=None, modalities=None):
        from omnistage import Omni
        from tests.support.toy_pipelines import PIPELINES

        if name not in self._omnis:
            self._omnis[name] = Omni(PIPELINES[name](), placement="inline")
        (out,) = self._omnis[name].generate([prompt], params, modalities=modalities, use_tqdm=False)
        assert out.error is None, out.error
        return out

    def close(self) -> None:
        for omni in self._omnis.values():
            omni.shutdown()


@pytest.fixture(scope="session")
def reference():
    ref = Reference()
    yield ref
    ref.close()


@pytest.fixture(scope="session")
def demo_chat_app(tmp_path_factory):
    """The demo chat model (SmolLM2-135M-Instruct, trained weights) on the real app, in this process: one
    for the structured-output and tool-call modules (the `serving` area runs on one worker)."""
    from omnistage.demo.smollm import smollm2_dir
    from tests.support.in_process import served

    yield from served(smollm2_dir(), "smollm2", tmp_path_factory.mktemp("demo-chat"))
