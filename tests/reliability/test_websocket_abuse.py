"""Malformed and oversized input on every WebSocket route: an `error` event and, for what cannot be served,
a bounded close; never a server error, never a crash. The server stays healthy throughout."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.reliability.conftest import CHAT, VOICE, WS_EVENTS_PER_S

pytestmark = pytest.mark.e2e
MESSAGE_TOO_BIG = 1009
POLICY_VIOLATION = 1008


def open_realtime(url: str):
    ws = connect(url.replace("http://", "ws://") + f"/v1/realtime?model={CHAT}", max_size=None)
    assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
    return ws


def open_speech(url: str):
    ws = connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", max_size=None)
    ws.send(json.dumps({"type": "session.config", "model": VOICE}))
    return ws


# A route: how to open it, and an event it answers (to show the session still works after bad input).
ROUTES = {
    "realtime": (open_realtime, {"type": "input_audio_buffer.clear"}, "input_audio_buffer.cleared"),
    "speech-stream": (open_speech, {"type": "input.text", "text": "Still here."}, None),
}


def next_event(ws) -> dict:
    while True:
        message = ws.recv(timeout=60)
        if isinstance(message, str):
            return json.loads(message)


def assert_healthy(url: str) -> None:
    assert httpx.get(url + "/health", timeout=30).status_code == 200


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "bad,says",
    [
        ("this is not json {", "not valid JSON"),
        (b"\x00\x01binary where text is expected", "not binary"),
        (json.dumps({"type": "no.such.event"}), "unknown"),
        (json.dumps(["an", "array"]), "JSON object"),
    ],
    ids=["not-json", "binary", "unknown-type", "not-an-object"],
)
def test_a_bad_event_gets_an_error_event_and_the_session_goes_on(demo_server, route, bad, says) -> None:
    url = demo_server.url
    opener, probe, answer = ROUTES[route]
    ws = opener(url)
    ws.send(bad)
    error = next_event(ws)
    assert error["type"] == "error", error
    message = error["error"]["message"] if route == "realtime" else error["message"]
    assert says in message, message
    ws.send(json.dumps(probe))
    if answer is not None:
        assert next_event(ws)["type"] == answer
    else:  # the speech socket speaks the text once the utterance is done
        ws.send(json.dumps({"type": "input.done"}))
        assert next_event(ws)["type"] == "audio.start"
    ws.close()
    assert_healthy(url)


@pytest.mark.parametrize("route", ROUTES)
def test_a_64_mib_frame_is_refused_with_a_bounded_close(demo_server, route) -> None:
    """The frame is over the server's WebSocket message limit (16 MiB): the protocol closes the socket
    with 1009 before the frame is buffered whole; the server is unharmed."""
    url = demo_server.url
    ws = ROUTES[route][0](url)
    big = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (64 * 1024 * 1024)})
    with pytest.raises(ConnectionClosed):
        ws.send(big)
        next_event(ws)
    assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == MESSAGE_TOO_BIG
    assert_healthy(url)


@pytest.mark.parametrize("route", ROUTES)
def test_a_flood_of_events_gets_an_error_event_and_a_close(demo_server, route) -> None:
    url = demo_server.url
    ws = ROUTES[route][0](url)
    flood = json.dumps({"type": "no.such.event"})  # cheap to send; each would get its own error
    errors = []
    # The close may come while the flood is still being sent: the events received before it are still read.
    with contextlib.suppress(ConnectionClosed):
        for _ in range(50 * WS_EVENTS_PER_S):
            ws.send(flood)
    with pytest.raises(ConnectionClosed):
        while True:
            errors.append(next_event(ws))
    assert errors, "no error event before the close"
    assert ws.protocol.close_rcvd is not None and ws.protocol.close_rcvd.code == POLICY_VIOLATION
    last = errors[-1]
    message = last["error"]["message"] if route == "realtime" else last["message"]
    assert last["type"] == "error" and "events a second" in message, last
    assert len(errors) < 10 * WS_EVENTS_PER_S  # the burst's errors, then the rate's: the rest went unread
    assert_healthy(url)
