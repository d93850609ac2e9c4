"""Checks every request passes before a route sees it: the API key, the body size, and draining.

Pure ASGI middleware rather than FastAPI dependencies, so the body limit holds while the body is still
being received (a 1 GB upload is refused after `max_request_bytes`, not after it has been buffered) and so
no route can forget a check.
"""

from __future__ import annotations

import asyncio
import hmac
import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omnistage.serving.errors import error_body
from omnistage.serving.settings import ServerSettings

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
    ):
        self.app = app
        self.settings = settings
        self.state = state
        self.open_paths = PUBLIC_PATHS | open_paths
        self._key = settings.api_key.encode() if settings.api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
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

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, _limited(receive, limit), tracking_send)
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


def _limited(receive: Receive, limit: int) -> Receive:
    """A receive that fails with 413 once more than `limit` body bytes arrived (chunked uploads)."""
    received = 0

    async def wrapped() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise HTTPException(413, f"request body exceeds the limit of {limit} bytes")
        return message

    return wrapped
