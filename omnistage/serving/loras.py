"""LoRA adapters a diffusion request may name: the server's registry of them, and a request's `lora` field.

Adapters are registered at start (`omnistage serve --lora-modules NAME=PATH ...`, vLLM's flag) or at run
time (`POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter`, vLLM's routes). A request names one in
`lora` with vLLM-Omni's flexible keys (`name` | `lora_name` | `adapter`, `path` | `lora_path` |
`local_path`, `scale` | `lora_scale`, `int_id` | `lora_int_id`); a path in a request is read only under the
server's `--allowed-local-media-path` (the operator's opt-in to reading local files for clients). The stage
loads, caches and applies it (stages/diffusion/lora.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.errors import InvalidRequestError

KEYS = {
    "name": ("name", "lora_name", "adapter"),
    "path": ("path", "lora_path", "local_path"),
    "scale": ("scale", "lora_scale"),
    "int_id": ("int_id", "lora_int_id"),
}
SCALE_RANGE = (-10.0, 10.0)


def parse_lora_modules(values: list[str] | None) -> dict[str, Path]:
    """`--lora-modules NAME=PATH ...` (a bare PATH is named after its file or folder)."""
    modules: dict[str, Path] = {}
    for value in values or ():
        name, sep, path = value.partition("=")
        if not sep:
            name, path = Path(value).stem, value
        if not name or not path:
            raise ValueError(f"--lora-modules: {value!r} is not NAME=PATH")
        modules[name] = Path(path).expanduser().resolve()
    return modules


class LoraRegistry:
    def __init__(self, modules: dict[str, Path] | None = None, allowed_dir: Path | None = None):
        self.adapters: dict[str, Path] = dict(modules or {})
        self.allowed_dir = allowed_dir

    def add(self, name: Any, path: Any) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidRequestError("lora_name: a non-empty string is required", param="lora_name")
        if not isinstance(path, str) or not path:
            raise InvalidRequestError("lora_path: a non-empty string is required", param="lora_path")
        if name in self.adapters:
            raise InvalidRequestError(f"lora_name: adapter {name!r} is already loaded", param="lora_name")
        resolved = Path(path).expanduser().resolve()
        if not resolved.exists():
            raise InvalidRequestError(f"lora_path: nothing at {path!r}", param="lora_path")
        self.adapters[name] = resolved

    def remove(self, name: Any) -> None:
        if name not in self.adapters:
            raise InvalidRequestError(f"lora_name: no adapter named {name!r}", param="lora_name")
        del self.adapters[name]

    def for_model(self, model: Any, value: Any) -> dict[str, Any] | None:
        """`DiffusionParams.lora` for a request to `model` (a ServedModel) from its `lora` field."""
        if value is not None and not model.capabilities.stages_for("diffusion"):
            raise InvalidRequestError(f"lora: model {model.name!r} has no diffusion stage", param="lora")
        return self.request_fields(value)

    def request_fields(self, value: Any) -> dict[str, Any] | None:
        """`DiffusionParams.lora` from a request's `lora` field (None: no adapter)."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise InvalidRequestError("lora: must be a JSON object", param="lora")
        found = {field: _first(value, names) for field, names in KEYS.items()}
        unknown = sorted(set(value) - {n for names in KEYS.values() for n in names})
        if unknown:
            raise InvalidRequestError(f"lora.{unknown[0]}: unknown field", param=f"lora.{unknown[0]}")
        name, path, scale = found["name"], found["path"], found["scale"]
        if scale is None:
            scale = 1.0
        if isinstance(scale, bool) or not isinstance(scale, int | float):
            raise InvalidRequestError("lora.scale: must be a number", param="lora.scale")
        if not SCALE_RANGE[0] <= scale <= SCALE_RANGE[1]:
            raise InvalidRequestError(f"lora.scale: must be in {list(SCALE_RANGE)}", param="lora.scale")
        if name is not None and not isinstance(name, str):
            raise InvalidRequestError("lora.name: must be a string", param="lora.name")
        if path is None:
            if name is None:
                raise InvalidRequestError(
                    "lora.name: an adapter's name (or path) is required", param="lora.name"
                )
            if name not in self.adapters:
                known = ", ".join(sorted(self.adapters)) or "none registered"
                raise InvalidRequestError(
                    f"lora.name: no adapter named {name!r} ({known})", param="lora.name"
                )
            return {"name": name, "path": str(self.adapters[name]), "scale": float(scale)}
        return {"name": name or Path(str(path)).stem, "path": str(self._allowed(path)), "scale": float(scale)}

    def _allowed(self, path: Any) -> Path:
        if not isinstance(path, str) or not path:
            raise InvalidRequestError("lora.path: must be a non-empty string", param="lora.path")
        resolved = Path(path).expanduser().resolve()
        if resolved in self.adapters.values():
            return resolved
        root = self.allowed_dir
        if root is None or not resolved.is_relative_to(root):
            raise InvalidRequestError(
                "lora.path: this server reads adapter files only under --allowed-local-media-path; name a "
                "registered adapter instead (--lora-modules, POST /v1/load_lora_adapter)",
                param="lora.path",
            )
        if not resolved.exists():
            raise InvalidRequestError(f"lora.path: nothing at {path!r}", param="lora.path")
        return resolved


def _first(value: dict[str, Any], names: tuple[str, ...]) -> Any:
    return next((value[n] for n in names if value.get(n) is not None), None)
