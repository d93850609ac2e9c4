"""Registry of model families. A family is a module in `omnistage.pipelines` that registers its
`PipelineSpec` (matched by model_type / architectures / diffusers class) or a resolver function for
families that need to look deeper into the model directory. A module may also register a *source*: a
function that turns a model given in another format (a GGUF file) into a standard model directory before
any pipeline is matched, so engines only ever see ordinary directories."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from omnistage.config.pipeline import PipelineSpec

if TYPE_CHECKING:
    from omnistage.config.resolve import ModelInfo

logger = logging.getLogger(__name__)

Resolver = Callable[["ModelInfo"], PipelineSpec | None]
Source = Callable[[Path], Path | None]

_PIPELINES: dict[str, PipelineSpec] = {}
_RESOLVERS: list[tuple[int, str, Resolver]] = []
_SOURCES: dict[str, Source] = {}
_discovered = False
_discovering = threading.RLock()  # a server starts its models in threads: each waits for one discovery


def register(spec: PipelineSpec) -> PipelineSpec:
    _PIPELINES[spec.name] = spec
    return spec


def register_resolver(name: str, resolver: Resolver, priority: int = 0) -> Resolver:
    """Resolvers run after exact matches, highest priority first; the first non-None answer wins."""
    _RESOLVERS[:] = [r for r in _RESOLVERS if r[1] != name]
    _RESOLVERS.append((priority, name, resolver))
    _RESOLVERS.sort(key=lambda r: -r[0])
    return resolver


def register_source(name: str, source: Source) -> Source:
    """`source(path)` returns the model directory `path` stands for, or None when it is not its format."""
    _SOURCES[name] = source
    return source


def discover() -> None:
    """Import every family module once so it can register itself."""
    global _discovered
    with _discovering:
        if _discovered:
            return
        _discovered = True  # a family module that asks the registry while importing sees it as it is
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


def sources() -> list[tuple[str, Source]]:
    discover()
    return list(_SOURCES.items())
