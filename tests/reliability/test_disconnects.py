"""A client that goes away in the middle of a stream, on every streaming route, frees every stage that was
working for it: nothing keeps generating for nobody."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from websockets.sync.client import connect

from tests.reliability.conftest import CHAT, VOICE, held, wait_all_free
from tests.support.polling import wait_until

pytestmark = pytest.mark.e2e
STORY = [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper."}]
LONG_TEXT = " ".join(
    f"Sentence number {k} of a long passage, spoken one clause at a time." for k in range(30)
)


def ws_url(url: str, path: str) -> str:
    return url.replace("http://", "ws://") + path


def leave_mid_stream(url: str, path: str, body: dict) -> None:
    """Read the first streamed bytes, check the stages hold the request, then drop the connection."""
    with httpx.stream("POST", url + path, json=body, timeout=120) as response:
        assert response.status_code == 200
        chunks = response.iter_bytes()  # kept: a dropped iterator would close the stream
        next(chunks)
        wait_until(lambda: held(url), 30, "the request in the stages")
    wait_all_free(url, path)


@pytest.mark.parametrize(
    "path,body",
    [
        (
            "/v1/chat/completions",
            {"model": CHAT, "stream": True, "max_tokens": 2000, "ignore_eos": True, "messages": STORY},
        ),
        (
            "/v1/chat/completions",
            {
                "model": CHAT,
                "stream": True,
                "max_tokens": 2000,
                "ignore_eos": True,
                "messages": STORY,
                "modalities": ["text", "audio"],
                "audio": {"voice": "alloy", "format": "pcm16"},
            },
        ),
        ("/v1/audio/speech", {"model": VOICE, "input": LONG_TEXT, "stream": True}),
        ("/v1/audio/speech", {"model": VOICE, "input": LONG_TEXT, "stream": True, "stream_format": "audio"}),
    ],
    ids=["chat-sse", "spoken-chat-sse", "speech-sse", "speech-raw-audio"],
)
def test_leaving_an_http_stream_frees_every_stage(demo_server, path: str, body: dict) -> None:
    leave_mid_stream(demo_server.url, path, body)


def test_leaving_the_speech_websocket_frees_every_stage(demo_server) -> None:
    url = demo_server.url
    ws = connect(ws_url(url, "/v1/audio/speech/stream"))
    ws.send(json.dumps({"type": "session.config", "model": VOICE, "stream_audio": True}))
    ws.send(json.dumps({"type": "input.text", "text": LONG_TEXT}))
    ws.send(json.dumps({"type": "input.done"}))
    while isinstance(message := ws.recv(timeout=60), str):  # until the first audio frame
        assert json.loads(message)["type"] != "error", message
    ws.socket.shutdown(socket.SHUT_RDWR)  # gone, without a closing handshake
    ws.socket.close()
    wait_all_free(url, "speech websocket")


def test_leaving_a_realtime_session_mid_response_frees_every_stage(demo_server) -> None:
    url = demo_server.url
    ws = connect(ws_url(url, f"/v1/realtime?model={CHAT}"))
    assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": STORY[0]["content"]}],
    }
    ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}}))
    while json.loads(ws.recv(timeout=60))["type"] != "response.output_audio.delta":
        pass
    ws.socket.shutdown(socket.SHUT_RDWR)
    ws.socket.close()
    wait_all_free(url, "realtime session")
