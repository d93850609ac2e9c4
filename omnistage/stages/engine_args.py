"""Each engine's `engine_args` as a typed struct, checked when a deployment resolves.

An engine factory names its struct (`create_engine.args_type`); a component a deployment names by reference
(a generator, a model loader) may add fields through its own struct (`fn.engine_args`): the family owns
those. A key neither declares, a value of the wrong type, or a reference that does not import fails the
start with a message naming the key, the stage and the keys that exist (the closest first).
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar, TypeVar

import msgspec

from omnistage.config.pipeline import StageSpec, load_ref
from omnistage.errors import ConfigError

T = TypeVar("T", bound="EngineArgs")


class EngineArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of the engines' and components' argument structs."""

    # Fields whose value is a function reference ("module:function"): checked to import at load, and the
    # components whose own `engine_args` struct extends this one.
    refs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls: type[T], args: dict[str, Any]) -> T:
        """The fields of `args` this struct declares, converted (the others belong to an extension)."""
        return msgspec.convert(
            {k: v for k, v in args.items() if k in cls.__struct_fields__}, cls, strict=False
        )


def declared_types(stage: StageSpec, args: dict[str, Any]) -> list[type[EngineArgs]]:
    """The engine's struct, then the extensions of the components `args` names by reference."""
    where = f"engine_args of stage {stage.stage_id} ({stage.name})"
    base = getattr(
        _load(stage.engine_ref, f"stage {stage.stage_id} ({stage.name}): engine"), "args_type", None
    )
    if base is None:
        return []
    types = [base]
    for field in base.refs:
        if args.get(field) is None:
            continue
        component = _load(args[field], f"{where}: {field}")
        if not callable(component):
            raise ConfigError(f"{where}: {field} = {args[field]!r} is not a function")
        extension = getattr(component, "engine_args", None)
        if extension is not None:
            types.append(extension)
    return types


def check_engine_args(stage: StageSpec, args: dict[str, Any]) -> None:
    """ConfigError unless every key of `args` is declared, typed right, and every reference loads."""
    where = f"engine_args of stage {stage.stage_id} ({stage.name})"
    types = declared_types(stage, args)
    if not types:
        return  # an engine of a user's own, with its own rules
    known = sorted({f for t in types for f in t.__struct_fields__})
    for key in args:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint} (known keys: {', '.join(known)})")
    for kind in types:
        try:
            kind.of(args)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{where}: {exc}") from None


def _load(ref: Any, where: str) -> Any:
    try:
        return load_ref(ref)
    except (ImportError, AttributeError, ValueError, ConfigError) as exc:
        raise ConfigError(f"{where} = {ref!r} does not load: {exc}") from exc
