"""The realtime socket's handshake, in process: the API key is enforced before anything else, and a server
without a model that can hold a session says why in an `error` event before closing."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omnistage.serving.app import create_app
from omnistage.serving.settings import ServerSettings

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    root = tmp_path_factory.mktemp("realtime-auth")
    settings = ServerSettings(api_key="secret", storage_dir=root / "storage", voices_dir=root / "voices")
    return TestClient(create_app({}, settings))


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"}, {"authorization": "secret"}])
def test_a_socket_without_the_key_is_closed_before_it_opens(client: TestClient, headers: dict):
    url = "/v1/realtime"
    with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect(url, headers=headers):
        pass
    assert closed.value.code == 1008


def test_with_the_key_an_unknown_model_is_an_error_event(client: TestClient):
    with client.websocket_connect(
        "/v1/realtime?model=nope", headers={"authorization": "Bearer secret"}
    ) as ws:
        event = ws.receive_json()
        assert event["type"] == "error" and event["error"]["param"] == "model"
        assert "`nope` does not exist" in event["error"]["message"]
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
    assert closed.value.code == 1008
