"""The playground's files are served by the app itself, need no API key (the page asks for it), reference
nothing but the server, and are gone with `--no-playground`."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from omnistage.cli import build_parser
from omnistage.serving.app import create_app
from omnistage.serving.cli_args import settings_from_args
from omnistage.serving.routes.playground import STATIC_DIR
from omnistage.serving.settings import ServerSettings

pytestmark = pytest.mark.unit
KEY = "sekret"
KEY_PROTOCOL = f"openai-insecure-api-key.{KEY}"  # how a browser's WebSocket carries the key


def app_client(tmp_path, **settings) -> TestClient:
    return TestClient(create_app({}, ServerSettings(storage_dir=tmp_path, voices_dir=tmp_path, **settings)))


def test_the_page_and_its_files_need_no_key_but_the_api_does(tmp_path):
    client = app_client(tmp_path, api_key=KEY)
    for path in ("/", "/playground"):
        response = client.get(path)
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        assert response.text == (STATIC_DIR / "index.html").read_text()
        assert "default-src 'self'" in response.headers["content-security-policy"]
    assert client.get("/playground/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/playground/style.css").headers["content-type"].startswith("text/css")
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert client.get("/playground/../settings.py").status_code in (401, 404)  # only the listed files
    assert "/" not in client.get("/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()["paths"]


def test_no_playground_serves_no_page(tmp_path):
    client = app_client(tmp_path, playground=False)
    for path in ("/", "/playground", "/playground/app.js"):
        assert client.get(path).status_code == 404
    flags = build_parser().parse_args(["serve", "--no-playground"])
    assert settings_from_args(flags).playground is False
    assert settings_from_args(build_parser().parse_args(["serve"])).playground is True


def test_the_page_references_only_its_own_server():
    html = (STATIC_DIR / "index.html").read_text()
    references = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert sorted(references) == ["/playground/app.js", "/playground/style.css"]
    for name in ("index.html", "app.js", "style.css"):
        text = (STATIC_DIR / name).read_text()
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/|@import", text), name


@pytest.mark.parametrize(
    ("protocols", "accepted"),
    [(["realtime", KEY_PROTOCOL], "realtime"), ([KEY_PROTOCOL], None)],
)
def test_the_live_panels_socket_carries_the_key_as_a_subprotocol(tmp_path, protocols, accepted):
    """A browser cannot set headers on a WebSocket: the page sends the key as OpenAI's subprotocol, and the
    server answers with `realtime`, the subprotocol a browser must get back among those it offered."""
    client = app_client(tmp_path, api_key=KEY)
    url = "/v1/realtime?model=nope"
    with client.websocket_connect(url, subprotocols=protocols) as ws:
        assert ws.accepted_subprotocol == accepted
        event = ws.receive_json()  # past the key: the next check is the model's
        assert event["type"] == "error" and "`nope` does not exist" in event["error"]["message"]
    for wrong in (["realtime", "openai-insecure-api-key.wrong"], ["realtime", KEY], ["realtime"]):
        with pytest.raises(WebSocketDisconnect) as closed, client.websocket_connect(url, subprotocols=wrong):
            pass
        assert closed.value.code == 1008
