"""Multipart forms: read text fields into a pydantic model and files into bytes, and describe the same
form in the OpenAPI schema (FastAPI cannot infer it from a hand-read form)."""

from __future__ import annotations

import json
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


def text_fields(form: FormData, files: set[str], structured: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Non-file fields; a field sent twice keeps its last value. A `structured` field (a list or an object,
    e.g. `stage_params`) comes as JSON text (`stage_params=[{"top_k": 1}]`, as curl users send it) or in
    bracket notation (`stage_params[][top_k]=1`, as the `openai` client sends `extra_body` in a form)."""
    fields: dict[str, Any] = {}
    for key, value in form.multi_items():
        if key in files:
            continue
        if not isinstance(value, str):
            raise SchemaError(f"{key}: expected a text field, got a file", param=key)
        base, _, rest = key.partition("[")
        if base in structured and rest:
            _put(fields, base, _path(rest, key), _scalar(value))
        elif key in structured:
            fields[key] = _json(value, key)
        else:
            fields[key] = value
    return fields


def _path(rest: str, key: str) -> list[str]:
    """`][top_k]` (after `name[`) → ["", "top_k"]: "" appends to a list, a name sets an object's field."""
    parts = ("[" + rest).split("]")
    if parts[-1] != "" or any(not p.startswith("[") for p in parts[:-1]):
        raise SchemaError(f"{key}: malformed bracket notation", param=key.partition("[")[0])
    return [p[1:] for p in parts[:-1]]


def _put(node: dict[str, Any] | list[Any], key: Any, path: list[str], value: Any) -> None:
    """Set `value` under `key` of `node` along `path`. An "" step appends a new object to a list unless the
    last one lacks the next step's field (so `a[][x]=1&a[][y]=2` is one object, `a[][x]=1&a[][x]=2` two)."""
    if not path:
        node[key] = value
        return
    step, rest = path[0], path[1:]
    if step == "":
        items = node.setdefault(key, []) if isinstance(node, dict) else node[key]
        if not isinstance(items, list):
            raise SchemaError(f"{key}: mixes a list and an object", param=str(key))
        if not rest:
            items.append(value)
            return
        if not items or not isinstance(items[-1], dict) or (len(rest) == 1 and rest[0] in items[-1]):
            items.append({})
        _put(items[-1], rest[0], rest[1:], value)
        return
    child = node.setdefault(key, {})
    if not isinstance(child, dict):
        raise SchemaError(f"{key}: mixes a list and an object", param=str(key))
    _put(child, step, rest, value)


def _scalar(value: str) -> Any:
    """A form value inside a structured field: a number, true/false/null as JSON reads them, else text."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def _json(value: str, key: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise SchemaError(f"{key}: expected JSON ({exc})", param=key) from exc


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
