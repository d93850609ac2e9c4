"""TCP connector: payloads stay on the producer's host and the consumer fetches them from there.

The cross-host counterpart of the shared-memory connector, with the same contract: `put` returns a
`TensorRef` whose key names where the bytes are (`tcp://<host>:<port>/<id>`), the orchestrator routes that
reference and releases it when the request ends, the consumer reads it. On the wire a payload is two ZMQ
frames: the msgspec `TensorRef` header and the raw buffer, exactly what the shm connector stores; nothing is
pickled. The producer serves its payloads from one ROUTER socket on a thread of its own.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from typing import Any

import msgspec
import zmq

from omnistage.connectors.base import TensorRef, decode_payload, encode_payload

PREFIX = "tcp://"
FETCH_TIMEOUT_S = 60.0  # a producer that does not answer for this long is gone (its host or its actor)
_HEADER = msgspec.msgpack.Encoder()
_HEADER_DEC = msgspec.msgpack.Decoder(TensorRef)


def is_tcp_key(key: str) -> bool:
    return key.startswith(PREFIX)


def node_ip() -> str:
    """This host's address as other hosts reach it: `OMNISTAGE_NODE_IP`, else the interface of the default
    route (a UDP connect sends nothing), else loopback."""
    if os.environ.get("OMNISTAGE_NODE_IP"):
        return os.environ["OMNISTAGE_NODE_IP"]
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))
        return s.getsockname()[0]
    return "127.0.0.1"


class TcpConnector:
    """The producer's side: a store of encoded payloads and the thread that serves them."""

    name = "tcp"

    def __init__(self, host: str | None = None):
        self.store: dict[str, tuple[bytes, bytes]] = {}
        self.lock = threading.Lock()
        self.stats = {"put_bytes": 0, "puts": 0, "served": 0, "dropped": 0}
        self.context = zmq.Context.instance()
        self.server = self.context.socket(zmq.ROUTER)
        self.server.setsockopt(zmq.LINGER, 0)
        self.server.bind(f"tcp://{host or node_ip()}:*")
        self.address = self.server.getsockopt_string(zmq.LAST_ENDPOINT)
        self.stop = self.context.socket(zmq.PAIR)
        self.stop.bind(f"inproc://tcp-connector-{id(self)}")
        self.thread = threading.Thread(target=self._serve, name="tcp-connector", daemon=True)
        self.thread.start()

    def put(self, obj: Any) -> TensorRef:
        ref, data = encode_payload(obj)
        key = f"{self.address}/{uuid.uuid4().hex[:16]}"
        with self.lock:
            self.store[key] = (_HEADER.encode(ref), bytes(data))
        self.stats["puts"] += 1
        self.stats["put_bytes"] += ref.nbytes
        return msgspec.structs.replace(ref, key=key, created=time.time())

    def _serve(self) -> None:
        stop = self.context.socket(zmq.PAIR)
        stop.connect(f"inproc://tcp-connector-{id(self)}")
        poller = zmq.Poller()
        poller.register(self.server, zmq.POLLIN)
        poller.register(stop, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if stop in events:
                    return
                peer, op, key = self.server.recv_multipart()
                key_s = key.decode()
                with self.lock:
                    entry = self.store.pop(key_s, None) if op in (b"take", b"drop") else self.store.get(key_s)
                if op == b"drop":
                    self.stats["dropped"] += entry is not None
                    continue
                self.stats["served"] += entry is not None
                self.server.send_multipart([peer, key, *(entry or (b"",))], copy=False)
        finally:
            stop.close(linger=0)

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self.stop.send(b"")
        self.thread.join(5)
        self.stop.close(linger=0)
        self.server.close(linger=0)
        self.store.clear()


class _Peers(threading.local):
    """One DEALER socket per producer address and thread (ZMQ sockets are not thread-safe)."""

    def __init__(self) -> None:
        self.sockets: dict[str, zmq.Socket] = {}

    def get(self, address: str) -> zmq.Socket:
        sock = self.sockets.get(address)
        if sock is None:
            sock = zmq.Context.instance().socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address)
            self.sockets[address] = sock
        return sock


_peers = _Peers()


def _split(key: str) -> str:
    return key.rsplit("/", 1)[0]


def fetch(ref: TensorRef, release_after: bool | None = None) -> Any:
    """Read a payload from its producer (a copy); `take` it (the producer forgets it) if the ref owns it."""
    take = ref.owned if release_after is None else release_after
    sock = _peers.get(_split(ref.key))
    sock.send_multipart([b"take" if take else b"get", ref.key.encode()])
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    while True:
        if not sock.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            raise ConnectionError(f"payload {ref.key}: no answer from its producer in {FETCH_TIMEOUT_S:.0f}s")
        key, *frames = sock.recv_multipart(copy=False)
        if key.bytes.decode() == ref.key:  # an answer to an earlier, abandoned fetch is skipped
            break
    if len(frames) != 2:
        raise KeyError(f"payload {ref.key} is gone from its producer (released, or the producer restarted)")
    header = _HEADER_DEC.decode(frames[0].buffer)
    return decode_payload(header, frames[1].buffer)


def drop(key: str) -> None:
    """Tell the producer to forget a payload (a request ended); no answer is awaited."""
    with contextlib.suppress(zmq.ZMQError):
        _peers.get(_split(key)).send_multipart([b"drop", key.encode()], zmq.NOBLOCK)
