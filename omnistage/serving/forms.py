"""Multipart forms: read text fields into a pydantic model and files into bytes, and describe the same
form in the OpenAPI schema (FastAPI cannot infer it from a hand-read form)."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel
from starlette.datastructures import FormData, UploadFile

from omnistage.errors import InvalidRequestError
from omnistage.serving.errors import SchemaError


async def read_form(request: Request) -> FormData:
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        raise SchemaError(
            f"body: expected multipart/form-data, got {content_type.split(';')[0] or 'no content type'}",
            param=None,
        )
    try:
        return await request.form()
    except (AssertionError, ValueError, KeyError) as exc:
        raise InvalidRequestError(f"body: malformed form data ({exc})") from exc


def text_fields(form: FormData, files: set[str]) -> dict[str, Any]:
    """Non-file fields; a field sent twice keeps its last value."""
    fields: dict[str, Any] = {}
    for key, value in form.multi_items():
        if key in files:
            continue
        if not isinstance(value, str):
            raise SchemaError(f"{key}: expected a text field, got a file", param=key)
        fields[key] = value
    return fields


async def files(form: FormData, *names: str) -> list[tuple[str, bytes]]:
    """(field name, bytes) of every file under any of `names` (e.g. 'image' and 'image[]')."""
    result = []
    for name in names:
        for value in form.getlist(name):
            if not isinstance(value, UploadFile):
                raise SchemaError(f"{name}: expected a file upload, got a text value", param=name)
            result.append((name, await value.read()))
    return result


def multipart_openapi(
    model: type[BaseModel], files: dict[str, bool], required_files: tuple[str, ...] = ()
) -> dict:
    """`openapi_extra` for a route that reads `model`'s fields plus `files` (name → repeatable)."""
    schema = model.model_json_schema()
    properties = dict(schema.get("properties", {}))
    binary = {"type": "string", "format": "binary"}
    for name, repeatable in files.items():
        properties[name] = {"type": "array", "items": binary} if repeatable else binary
    form_schema = {
        "type": "object",
        "properties": properties,
        "required": list(schema.get("required", [])) + list(required_files),
    }
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": form_schema}}}}
