"""Registry of model families. A family is a module in `omnistage.pipelines` that registers its
`PipelineSpec` (matched by model_type / architectures / diffusers class) or a resolver function for
families that need to look deeper into the model directory."""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING

from omnistage.config.pipeline import PipelineSpec

if TYPE_CHECKING:
    from omnistage.config.resolve import ModelInfo

logger = logging.getLogger(__name__)

Resolver = Callable[["ModelInfo"], PipelineSpec | None]

_PIPELINES: dict[str, PipelineSpec] = {}
_RESOLVERS: list[tuple[int, str, Resolver]] = []
_discovered = False


def register(spec: PipelineSpec) -> PipelineSpec:
    _PIPELINES[spec.name] = spec
    return spec


def register_resolver(name: str, resolver: Resolver, priority: int = 0) -> Resolver:
    """Resolvers run after exact matches, highest priority first; the first non-None answer wins."""
    _RESOLVERS[:] = [r for r in _RESOLVERS if r[1] != name]
    _RESOLVERS.append((priority, name, resolver))
    _RESOLVERS.sort(key=lambda r: -r[0])
    return resolver


def discover() -> None:
    """Import every family module once so it can register itself."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    import omnistage.pipelines as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name != "registry":
            importlib.import_module(f"{package.__name__}.{info.name}")


def get(name: str) -> PipelineSpec:
    discover()
    return _PIPELINES[name]


def pipelines() -> dict[str, PipelineSpec]:
    discover()
    return dict(_PIPELINES)


def resolvers() -> list[tuple[str, Resolver]]:
    discover()
    return [(name, fn) for _, name, fn in _RESOLVERS]
