"""Slow clients cannot hold the server past its deadlines: a body trickled byte by byte gets a 408 when
`--request-body-timeout` runs out, and a client that stops reading a stream (HTTP or WebSocket) is dropped
when a send has waited `--send-timeout`, its work aborted in every stage."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx
import pytest
from websockets.sync.client import connect

from tests.reliability.conftest import BODY_TIMEOUT_S, VOICE, wait_all_free
from tests.support.polling import wait_until

pytestmark = pytest.mark.e2e
LONG_TEXT = " ".join(
    f"Sentence number {k} of a very long passage, read aloud clause by clause." for k in range(50)
)


def tiny_window_socket(url: str) -> socket.socket:
    """A connection whose receive buffer is as small as the kernel allows: a reader that stops reading
    stalls the server's sends after a few kilobytes."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    sock.connect((host, int(port)))
    return sock


def dropped(url: str, kind: str) -> float:
    """Connections the server has dropped for not reading (its /metrics counter)."""
    text = httpx.get(url + "/metrics", timeout=30).text
    found = re.search(rf'omnistage_slow_clients_dropped_total{{kind="{kind}"}} (\S+)', text)
    return float(found.group(1)) if found else 0.0


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(60)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_body_sent_byte_by_byte_gets_408(demo_server) -> None:
    host, port = demo_server.url.removeprefix("http://").split(":")
    body = json.dumps({"model": VOICE, "input": "x" * 200}).encode()
    sock = socket.create_connection((host, int(port)))
    head = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode())
    stop = threading.Event()

    def trickle() -> None:  # one byte every 100 ms: the whole body would take 20 s
        for byte in body:
            if stop.wait(0.1):
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        response = read_all(sock)
    finally:
        stop.set()
        sender.join()
        sock.close()
    status, _, rest = response.partition(b"\r\n")
    assert status == b"HTTP/1.1 408 Request Timeout", response[:300]
    error = json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]
    assert f"did not arrive within {BODY_TIMEOUT_S:g} s" in error["message"]


def test_a_stream_nobody_reads_is_dropped_and_its_work_aborted(demo_server) -> None:
    before = dropped(demo_server.url, "http")
    sock = tiny_window_socket(demo_server.url)
    body = json.dumps({"model": VOICE, "input": LONG_TEXT, "stream": True, "stream_format": "audio"}).encode()
    head = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
    wait_until(lambda: dropped(demo_server.url, "http") > before, 120, "the server dropping the client")
    wait_all_free(demo_server.url, "the dropped stream")  # dropped at the send deadline: stages aborted
    received = read_all(sock)  # what the buffers held, then the server's close
    sock.close()
    assert received.startswith(b"HTTP/1.1 200")
    assert not received.endswith(b"0\r\n\r\n"), "the whole answer was sent: the test never stalled a send"


def test_a_websocket_nobody_reads_is_dropped_and_its_work_aborted(demo_server) -> None:
    url = demo_server.url
    before = dropped(url, "websocket")
    sock = tiny_window_socket(url)
    # max_queue=1: the client's reader thread stops taking frames off the socket once one is waiting.
    ws = connect(url.replace("http://", "ws://") + "/v1/audio/speech/stream", sock=sock, max_queue=1)
    ws.send(json.dumps({"type": "session.config", "model": VOICE, "stream_audio": True}))
    for _ in range(3):
        ws.send(json.dumps({"type": "input.text", "text": LONG_TEXT}))
        ws.send(json.dumps({"type": "input.done"}))
    started = time.monotonic()
    wait_until(lambda: dropped(url, "websocket") > before, 120, "the server dropping the client")
    wait_all_free(url, "the dropped websocket")
    kinds = []
    while time.monotonic() - started < 120:
        try:
            message = ws.recv(timeout=30)
        except Exception:  # noqa: BLE001 - the server's close (or a reset): the socket is gone
            break
        if isinstance(message, str):
            kinds.append(json.loads(message)["type"])
    assert kinds.count("session.done") < 3, "every utterance was spoken: the test never stalled a send"
