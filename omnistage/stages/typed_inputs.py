"""What a request carries besides its prompt, as each engine's typed struct (`ARInputs`, `GenerationInputs`).

An engine declares its struct; a family that needs more (a talker's streamed text rows, a vision encoder's
DeepStack features) puts its own dataclass in the struct's `extension` field and reads it in the hooks it
registers: no free keys. A dict (a direct engine user's, vLLM style) is converted once, at the engine's
door: a key the struct does not declare is an InvalidRequestError naming it and the close match.

Streaming input (`add_chunk`) sends the same struct with only the new parts set; `extend` joins them.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any, TypeVar

import torch

from omnistage.errors import InvalidRequestError

T = TypeVar("T")


def inputs_of(kind: type[T], value: Any) -> T:
    """`value` as the engine's inputs struct: None gives the defaults; a dict's keys must be its fields."""
    if value is None:
        return kind()
    if isinstance(value, kind):
        return value
    if not isinstance(value, dict):
        raise InvalidRequestError(
            f"inputs must be {kind.__name__} (or a dict of its fields), got {type(value).__name__}",
            param="inputs",
        )
    known = [f.name for f in dataclasses.fields(kind) if f.init]
    for key in value:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidRequestError(
                f"unknown input {key!r}{hint} ({kind.__name__} has {', '.join(known)}; a family's own inputs "
                "go in its typed `extension`)",
                param=str(key),
            )
    return kind(**value)


def extend(inputs: Any, chunk: Any) -> None:
    """Join a streamed chunk into a request's inputs, field by field: tensors grow along dim 0, lists
    extend, a nested struct (the extension) joins the same way, and any other value that is set replaces
    the old one. Unset fields (None, or the field's default) leave the inputs as they are."""
    if chunk is None:
        return
    if type(chunk) is not type(inputs):
        raise TypeError(
            f"a chunk for {type(inputs).__name__} inputs must be one too, got {type(chunk).__name__}"
        )
    for field in dataclasses.fields(chunk):
        new, old = getattr(chunk, field.name), getattr(inputs, field.name)
        if new is None or _is_default(field, new):
            continue
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
            setattr(inputs, field.name, torch.cat([old, new], dim=0))
        elif isinstance(old, list) and isinstance(new, list):
            old.extend(new)
        elif dataclasses.is_dataclass(old) and type(old) is type(new):
            extend(old, new)
        else:
            setattr(inputs, field.name, new)


def _is_default(field: dataclasses.Field, value: Any) -> bool:
    if isinstance(value, torch.Tensor) or dataclasses.is_dataclass(value):
        return False
    if field.default is not dataclasses.MISSING:
        return value == field.default
    if field.default_factory is not dataclasses.MISSING:
        return value == field.default_factory()
    return False
