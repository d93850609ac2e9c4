"""Typed control messages between the orchestrator and stage workers, and their msgpack codec.

Tensors, arrays and images anywhere inside a message travel as msgpack extension values: small ones
inline (header + bytes in the frame), large ones through a connector (header only: shared memory, or the
producer's TCP connector across hosts).
Nothing is pickled.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import msgspec

from omnistage.connectors.base import Payload, TensorRef, decode_payload, encode_payload, is_payload_value
from omnistage.connectors.shm import ShmConnector
from omnistage.connectors.tcp import fetch, is_tcp_key
from omnistage.outputs import BULK_FIELDS, StageOutput, StageResult
from omnistage.params import DiffusionParams, GenerationParams, SamplingParams
from omnistage.prompts import Prompt

INLINE_EXT = 1
SHM_EXT = 2
INLINE_LIMIT = 64 * 1024  # below this many bytes a payload rides in the message frame

Params = SamplingParams | DiffusionParams | GenerationParams | None


# ---- orchestrator → worker -------------------------------------------------------------------------
class StartRequest(msgspec.Struct, tag=True):
    """Full handoff (or an entry stage): run the input processor on the prompt and finished upstream."""

    request_id: str
    prompt: Prompt | None
    params: Params
    upstream: dict[int, StageResult] = {}
    # an upstream stage's other sequences (a request with n > 1), by stage id, in index order
    upstream_choices: dict[int, list[StageResult]] = {}
    modalities: list[str] = []  # what the request asked the pipeline for (its final stages' outputs)


class ChunkInput(msgspec.Struct, tag=True):
    """Async-chunk handoff: one more upstream delta (the first one also carries prompt and params)."""

    request_id: str
    chunk: StageOutput
    last: bool
    prompt: Prompt | None = None
    params: Params = None
    first: bool = False
    modalities: list[str] = []  # with the first chunk: what the request asked the pipeline for


class Abort(msgspec.Struct, tag=True):
    request_ids: list[str]


class Call(msgspec.Struct, tag=True):
    """A control RPC on the engine (stats, sleep, wake_up...)."""

    call_id: int
    method: str
    args: list[Any] = []


class Shutdown(msgspec.Struct, tag=True):
    pass


# ---- worker → orchestrator -------------------------------------------------------------------------
class Ready(msgspec.Struct, tag=True):
    stage_id: int
    replica: int
    pid: int
    info: dict[str, Any] = {}


class Outputs(msgspec.Struct, tag=True):
    stage_id: int
    replica: int
    items: list[StageOutput]


class CallResult(msgspec.Struct, tag=True):
    stage_id: int
    replica: int
    call_id: int
    result: Any = None
    error: str | None = None


class StartupFailed(msgspec.Struct, tag=True):
    stage_id: int
    replica: int
    error: str


ToWorker = StartRequest | ChunkInput | Abort | Call | Shutdown
FromWorker = Ready | Outputs | CallResult | StartupFailed

_HEADER = msgspec.msgpack.Encoder()
_HEADER_DEC = msgspec.msgpack.Decoder(TensorRef)


class Codec:
    """Encodes one direction of traffic.

    `connector`: where large payloads go when encoding (None: always inline, the socket transport).
    `lazy`: decode shared-memory references as `Payload` handles instead of reading them (the
    orchestrator routes references, it does not touch bulk data).
    """

    def __init__(
        self,
        decode_type: Any,
        connector: ShmConnector | None = None,
        lazy: bool = False,
        inline_limit: int = INLINE_LIMIT,
    ):
        self.connector = connector
        self.lazy = lazy
        self.inline_limit = inline_limit
        # Set around one encode/decode to learn which segments it created or referenced.
        self.ledger: list[Payload] | None = None
        self.reader = ShmConnector()
        self._enc = msgspec.msgpack.Encoder(enc_hook=self._enc_hook)
        self._dec = msgspec.msgpack.Decoder(decode_type, ext_hook=self._ext_hook)

    def encode(self, msg: Any) -> bytes:
        return self._enc.encode(msg)

    def decode(self, data: bytes) -> Any:
        return self._dec.decode(data)

    def _enc_hook(self, obj: Any) -> Any:
        if isinstance(obj, Payload):
            return msgspec.msgpack.Ext(SHM_EXT, _HEADER.encode(obj.ref))
        if is_payload_value(obj):
            ref, data = encode_payload(obj)
            if self.connector is not None and ref.nbytes > self.inline_limit:
                shm_ref = self.connector.put(obj)
                if self.ledger is not None:
                    self.ledger.append(Payload(shm_ref))
                return msgspec.msgpack.Ext(SHM_EXT, _HEADER.encode(shm_ref))
            header = _HEADER.encode(ref)
            return msgspec.msgpack.Ext(INLINE_EXT, struct.pack("<I", len(header)) + header + bytes(data))
        raise TypeError(
            f"cannot send a {type(obj).__name__} between stages (tensors, arrays, images, "
            "msgspec structs and plain data only)"
        )

    def _ext_hook(self, code: int, data: memoryview) -> Any:
        if code == INLINE_EXT:
            (n,) = struct.unpack_from("<I", data)
            ref = _HEADER_DEC.decode(data[4 : 4 + n])
            return decode_payload(ref, data[4 + n :])
        if code == SHM_EXT:
            ref = _HEADER_DEC.decode(data)
            if self.lazy:  # whoever reads it later must not unlink it: the orchestrator's ledger does
                handle = Payload(msgspec.structs.replace(ref, owned=False))
                if self.ledger is not None:
                    self.ledger.append(handle)
                return handle
            return fetch(ref) if is_tcp_key(ref.key) else self.reader.get(ref)
        raise ValueError(f"unknown payload extension {code}")


@dataclasses.dataclass
class Unreadable:
    """What a message that does not fit its schema still tells (a sender put a value of a type its message
    does not declare): its plain fields, so the receiver can fail the requests it names, and the
    shared-memory payloads it references, so they can be freed; nothing waits for a message never read."""

    fields: Any
    segments: list[TensorRef]
    error: Exception

    @property
    def plain(self) -> dict[str, Any]:
        """Its fields by name (empty where it was no map at all)."""
        return self.fields if isinstance(self.fields, dict) else {}

    @property
    def request_ids(self) -> list[str]:
        """The requests the message is about: its own `request_id`(s), or those of its output items."""
        fields = self.plain
        named = [fields.get("request_id")] + list(fields.get("request_ids") or [])
        for key in ("items", "chunk"):
            items = fields.get(key)
            for item in items if isinstance(items, list) else [items]:
                if isinstance(item, dict):
                    named.append(item.get("request_id"))
        return list(dict.fromkeys(r for r in named if isinstance(r, str)))


def salvage(data: bytes | memoryview, error: Exception) -> Unreadable:
    """Read an undecodable message without its schema: plain fields (payloads as None) and its segments."""
    segments: list[TensorRef] = []

    def hook(code: int, raw: memoryview) -> None:
        if code == SHM_EXT:
            segments.append(_HEADER_DEC.decode(raw))

    try:
        fields = msgspec.msgpack.decode(data, ext_hook=hook)
    except (msgspec.DecodeError, ValueError):  # not msgpack at all: nothing to salvage
        fields = None
    return Unreadable(fields, segments, error)


def iter_payloads(obj: Any, values: bool = False):
    """Every `Payload` handle inside a decoded structure (and, with `values`, every tensor/array too)."""
    if isinstance(obj, Payload) or (values and is_payload_value(obj)):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from iter_payloads(v, values)
    elif isinstance(obj, list | tuple):
        for v in obj:
            yield from iter_payloads(v, values)
    elif isinstance(obj, StageOutput):
        for name in BULK_FIELDS:
            yield from iter_payloads(getattr(obj, name), values)
        yield from iter_payloads(obj.data, values)
    elif isinstance(obj, StageResult):
        for parts in (
            obj.hidden_chunks,
            obj.code_chunks,
            obj.audio_chunks,
            obj.image_chunks,
            obj.video_chunks,
        ):
            yield from iter_payloads(parts, values)
        yield from iter_payloads(obj.chunks, values)
        yield from iter_payloads(obj.data, values)
