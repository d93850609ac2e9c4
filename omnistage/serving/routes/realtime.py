"""WS /v1/realtime: realtime voice sessions with the OpenAI GA event set (serving/realtime/).

The model is chosen when connecting (`?model=`, the official client's way; default: the first served model
that can answer in speech). The API key is checked on the handshake; a server at its bound of concurrent
sessions (`--max-realtime-sessions`) accepts the socket only to say so in an `error` event and close it
(1013, try again later), so a client sees why. A browser, which cannot set headers on a WebSocket, sends the
key as the subprotocol `openai-insecure-api-key.<key>` beside `realtime`, the subprotocol the server accepts.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from omnistage.errors import OmniError
from omnistage.serving.context import ServerContext
from omnistage.serving.realtime import transcription
from omnistage.serving.realtime.conversation import new_id
from omnistage.serving.realtime.session import HEARS_AUDIO, RealtimeSession
from omnistage.serving.routes.speech_stream import _authorized
from omnistage.serving.served import ServedModel

logger = logging.getLogger(__name__)
router = APIRouter()
PATH = "/v1/realtime"
ROUTE = "realtime"  # the route /v1/models lists for a model a session can be opened on
TRY_AGAIN_LATER = 1013


class Sessions:
    """How many sessions are open, against the server's bound."""

    def __init__(self, limit: int):
        self.limit, self.open = limit, 0


def _sessions(websocket: WebSocket, ctx: ServerContext) -> Sessions:
    state = websocket.app.state
    if getattr(state, "realtime_sessions", None) is None:
        state.realtime_sessions = Sessions(ctx.settings.max_realtime_sessions)
    return state.realtime_sessions


def session_model(ctx: ServerContext, name: str | None) -> ServedModel:
    """The model a session talks to: one that serves chat; one that does not hear audio needs a served
    transcription model."""
    model = ctx.models.get(name, produces=("text",), route=PATH, serves="chat")
    if not model.capabilities.serves(HEARS_AUDIO):
        transcription.transcriber(ctx, None)
    return model


def offers_sessions(ctx: ServerContext, model: ServedModel) -> bool:
    """Whether a session can be opened on `model`: it hears audio, or a served model transcribes for it."""
    try:
        session_model(ctx, model.name)
    except OmniError:
        return False
    return True


def _subprotocol(websocket: WebSocket) -> str | None:
    """`realtime` when the client offered it (a browser must get one of its offered subprotocols back)."""
    return ROUTE if ROUTE in websocket.scope.get("subprotocols", []) else None


async def _refuse(websocket: WebSocket, code: str, message: str, param: str | None = None) -> None:
    await websocket.accept(_subprotocol(websocket))
    error = {"type": "invalid_request_error", "code": code, "message": message, "param": param}
    await websocket.send_json({"type": "error", "event_id": new_id("event"), "error": error})
    await websocket.close(TRY_AGAIN_LATER if code == "session_limit_reached" else 1008)


@router.websocket(PATH)
async def realtime(websocket: WebSocket) -> None:
    ctx: ServerContext = websocket.app.state.omnistage
    if ctx.state.draining or not _authorized(websocket, ctx.settings.api_key):
        await websocket.close(1008)  # policy violation: no key, or the server is shutting down
        return
    try:
        model = session_model(ctx, websocket.query_params.get("model"))
    except OmniError as exc:
        await _refuse(websocket, "invalid_model", exc.message, exc.param)
        return
    sessions = _sessions(websocket, ctx)
    if sessions.open >= sessions.limit:
        message = f"the server has {sessions.open} realtime sessions open, its limit; try again later"
        await _refuse(websocket, "session_limit_reached", message)
        return
    sessions.open += 1
    try:
        await websocket.accept(_subprotocol(websocket))
        await RealtimeSession(websocket, ctx, model).run()
    except WebSocketDisconnect:
        logger.info("realtime session: client disconnected")
    finally:
        sessions.open -= 1
