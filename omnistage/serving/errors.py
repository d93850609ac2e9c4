"""The OpenAI error envelope and the handlers that turn every failure into it.

Clients (the `openai` SDK among them) read `{"error": {"message", "type", "param", "code"}}`; whatever
went wrong — schema, semantics, admission, a stage failure — reaches them in that shape with a status that
says whose fault it was, and never with a stack trace.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from omnistage.errors import OmniError, OverloadedError
from omnistage.serving.generation import ClientDisconnected

logger = logging.getLogger(__name__)

TYPE_BY_STATUS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    409: "ConflictError",
    413: "PayloadTooLargeError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class SchemaError(OmniError):
    """A field breaks the request schema in a way pydantic alone cannot see (a rule across fields): a 400,
    as OpenAI and vLLM answer every request-validation failure (clients branch on it)."""

    status_code = 400
    error_type = "BadRequestError"


class PayloadTooLargeError(OmniError):
    status_code = 413
    error_type = "PayloadTooLargeError"


class ConflictError(OmniError):
    status_code = 409
    error_type = "ConflictError"


def error_body(status: int, message: str, *, error_type: str | None = None, param: str | None = None) -> dict:
    error_type = error_type or TYPE_BY_STATUS.get(status, "InternalServerError")
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


def error_response(
    status: int,
    message: str,
    *,
    error_type: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = error_body(status, message, error_type=error_type, param=param)
    return JSONResponse(body, status_code=status, headers=headers)


def omni_error_body(exc: OmniError) -> dict:
    """The envelope for a typed omnistage error (also what streaming routes send as their last event)."""
    body = error_body(exc.status_code, exc.message, error_type=exc.error_type, param=exc.param)
    stage_id = getattr(exc, "stage_id", None)
    if stage_id is not None:
        body["error"]["stage_id"] = stage_id
    return body


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "tuple", "none"}


def _is_type_tag(part: str) -> bool:
    """pydantic puts union branches ('str', 'list[int]', 'function-after[...]') into error locations."""
    return part in _TYPE_TAGS or "[" in part or "-" in part


def field_path(loc: Sequence[Any]) -> str | None:
    """('body', 'messages', 0, 'content') -> 'messages[0].content': the field as a client wrote it."""
    text = ""
    for part in loc[1:] if loc and loc[0] in ("body", "query", "path", "header") else loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not _is_type_tag(str(part)):
            text += f".{part}" if text else str(part)
    return text or None


def _branch(error: dict[str, Any]) -> str:
    return next((str(p) for p in error.get("loc", ()) if isinstance(p, str) and _is_type_tag(p)), "")


def _most_specific(errors: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Of the errors about the first bad field, the one a client can act on: for a union, from the
    branch that failed least, and the deepest there ('prompt[1]: >= 0' rather than 'not a string')."""
    head = field_path(errors[0].get("loc", ())) or ""
    same = [e for e in errors if (field_path(e.get("loc", ())) or "").startswith(head)]
    counts = Counter(_branch(e) for e in same)
    return min(same, key=lambda e: (counts[_branch(e)], -len(e.get("loc", ()))))


def validation_error_response(errors: Sequence[dict[str, Any]]) -> JSONResponse:
    """400 naming the first offending field and its rule; the rest are counted so the message stays
    readable. Never FastAPI's 422: OpenAI clients expect 400 for every invalid request."""
    first = _most_specific(errors) if errors else {"loc": (), "msg": "invalid request"}
    param = field_path(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        message = f"request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}"
        param = None
    elif param:
        message = f"{param}: {first['msg']}"
    else:
        message = f"request body: {first['msg']}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    return error_response(400, message, param=param)


def pydantic_error_response(exc: ValidationError) -> JSONResponse:
    return validation_error_response(exc.errors(include_url=False))


ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": "integer"},
            },
            "required": ["message", "type", "param", "code"],
        }
    },
    "required": ["error"],
}


def document_400(app: FastAPI) -> None:
    """The OpenAPI document says what the handlers answer: 400 with the OpenAI envelope, not FastAPI's 422."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for item in schema.get("paths", {}).values():
                for operation in item.values():
                    responses = operation.get("responses", {})
                    if responses.pop("422", None) is not None:
                        content = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
                        responses["400"] = {"description": "Invalid request", "content": content}
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            components["Error"] = ERROR_SCHEMA
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def install_error_handlers(app: FastAPI, retry_after_s: int = 1) -> None:
    async def on_omni_error(request: Request, exc: OmniError) -> JSONResponse:
        headers = {"Retry-After": str(retry_after_s)} if isinstance(exc, OverloadedError) else None
        if exc.status_code >= 500:
            logger.warning("%s %s failed: %s", request.method, request.url.path, exc.message)
        return JSONResponse(omni_error_body(exc), status_code=exc.status_code, headers=headers)

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_error_response(exc.errors())

    async def on_pydantic_error(request: Request, exc: ValidationError) -> JSONResponse:
        return pydantic_error_response(exc)

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}"
        return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))

    async def on_client_gone(request: Request, exc: ClientDisconnected) -> Response:
        # Nobody reads this answer; the request was already aborted in every stage. 499 (nginx's "client
        # closed request") keeps it apart from server errors in the metrics.
        logger.info("%s %s: client disconnected, request aborted", request.method, request.url.path)
        return Response(status_code=499)

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal error ({type(exc).__name__})")

    app.add_exception_handler(OmniError, on_omni_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(ValidationError, on_pydantic_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(ClientDisconnected, on_client_gone)
    app.add_exception_handler(Exception, on_unexpected)
