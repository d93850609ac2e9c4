"""Checks every request passes before a route sees it: the API key, the body size, and draining; and the
deadlines that keep a slow client from holding the server: its body must arrive within
`request_body_timeout_s` (408 otherwise), and each thing the server sends it (a response part, a WebSocket
message) must leave within `send_timeout_s`, or the connection is dropped and its work aborted (a client
that stops reading would otherwise keep its request running in the stages, its output piling up here).

Pure ASGI middleware rather than FastAPI dependencies, so the body limit holds while the body is still
being received (a 1 GB upload is refused after `max_request_bytes`, not after it has been buffered) and so
no route can forget a check.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnistage.serving.errors import error_body
from omnistage.serving.settings import ServerSettings

logger = logging.getLogger(__name__)
PUBLIC_PATHS = frozenset({"/health"})


class ServerState:
    """Flags shared between the server runner and the request path."""

    def __init__(self) -> None:
        self.draining = False


async def _send_error(send: Send, status: int, message: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps(error_body(status, message)).encode()
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class RequestGuard:
    """`open_paths` need no API key (the playground's page, which asks for the key itself)."""

    def __init__(
        self,
        app: ASGIApp,
        settings: ServerSettings,
        state: ServerState,
        open_paths: frozenset[str] = frozenset(),
        on_slow_client: Callable[[str], None] = lambda kind: None,
    ):
        self.app = app
        self.settings = settings
        self.state = state
        self.open_paths = PUBLIC_PATHS | open_paths
        self._key = settings.api_key.encode() if settings.api_key else None
        self.on_slow_client = on_slow_client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            try:
                bounded = _bounded_send(send, self.settings.send_timeout_s, self.on_slow_client, "websocket")
                await self.app(scope, receive, bounded)
            except SlowClientError as exc:  # the route's work ended with it (the exception unwound it)
                logger.warning("%s: %s; dropped", scope.get("path", ""), exc)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if self.state.draining and path not in PUBLIC_PATHS:
            await _send_error(send, 503, "the server is shutting down", {"Connection": "close"})
            return
        if self._key is not None and path not in self.open_paths and not self._authorized(scope):
            await _send_error(send, 401, "missing or invalid API key", {"WWW-Authenticate": "Bearer"})
            return
        limit = self.settings.max_request_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_error(
                send, 413, f"request body of {declared} bytes exceeds the limit of {limit} bytes"
            )
            return
        started = False

        bounded = _bounded_send(send, self.settings.send_timeout_s, self.on_slow_client, "http")

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await bounded(message)

        body = _limited(receive, limit, self.settings.request_body_timeout_s)
        try:
            await self.app(scope, body, tracking_send)
        except SlowClientError as exc:  # the response's work was aborted as the exception unwound it
            logger.warning("%s: %s; dropped", path, exc)
        except asyncio.CancelledError:
            # Shutdown cancels what outlived the grace period (its stages were aborted on the way out):
            # the client gets the error envelope rather than a bare 500.
            if self.state.draining and not started:
                message = "the server shut down before the request finished; it was aborted"
                await _send_error(send, 503, message, {"Connection": "close"})
            raise

    def _authorized(self, scope: Scope) -> bool:
        auth = _header(scope, b"authorization") or ""
        scheme, _, token = auth.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._key)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class SlowClientError(Exception):
    """The client did not take what the server sent it within `send_timeout_s`."""


def _limited(receive: Receive, limit: int, timeout_s: float) -> Receive:
    """A receive that fails with 413 once more than `limit` body bytes arrived (chunked uploads), and with
    408 if the whole body has not arrived `timeout_s` after the route first asked for it. Once the body is
    in, receives pass through unbounded (a streaming route waits on one for the client's disconnect)."""
    received = 0
    deadline: float | None = None
    complete = False

    async def wrapped() -> Message:
        nonlocal received, deadline, complete
        if complete:
            return await receive()
        deadline = deadline or asyncio.get_running_loop().time() + timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            message = f"the request body did not arrive within {timeout_s:g} s"
            raise HTTPException(408, message, headers={"Connection": "close"}) from None
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise HTTPException(413, f"request body exceeds the limit of {limit} bytes")
            complete = not message.get("more_body", False)
        else:
            complete = True
        return message

    return wrapped


def _bounded_send(send: Send, timeout_s: float, on_slow: Callable[[str], None], kind: str) -> Send:
    """A send that gives up on a client that has taken nothing for `timeout_s` (counted once)."""
    dropped = False

    async def bounded(message: Message) -> None:
        nonlocal dropped
        if dropped:  # the connection is given up: what the route still sends fails at once
            raise SlowClientError(f"the client took nothing the server sent for {timeout_s:g} s")
        try:
            async with asyncio.timeout(timeout_s):  # a timer, not a task per message
                await send(message)
        except TimeoutError:
            if not dropped:
                dropped = True
                on_slow(kind)
            raise SlowClientError(f"the client took nothing the server sent for {timeout_s:g} s") from None

    return bounded
