"""The model families omnistage serves, listed in one place, and what they registered.

A family is a package under `omnistage/families/` whose `register()` adds its pipelines (`PipelineSpec`s,
matched by model_type / architectures / diffusers class), resolvers (functions that look deeper into a model
directory), sources (functions that turn another format, a GGUF file, into a standard model directory) and
its entries in the engines' registries (decoder-layer forms, diffusion step adapters, cache coefficients,
text-padding rules, extra model inputs). `load()` registers every family of `FAMILIES`, once, in order.

Each `PipelineSpec` names its family's `register` (`PipelineSpec.family`), so a stage process registers the
family it serves before it builds its engine, and a pipeline defined outside this package (a user's, or a
test's) registers its own the same way.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from omnistage.config.pipeline import PipelineSpec

if TYPE_CHECKING:
    from omnistage.families.resolve import ModelInfo

logger = logging.getLogger(__name__)

# Every built-in family, by package. Resolvers of equal priority answer in this order.
FAMILIES = (
    "omnistage.families.qwen2_5_omni",
    "omnistage.families.qwen3_omni",
    "omnistage.families.qwen3_tts",
    "omnistage.families.csm",
    "omnistage.families.higgs_audio_v2",
    "omnistage.families.dia",
    "omnistage.families.voxcpm2",
    "omnistage.families.vibevoice",
    "omnistage.families.janus",
    "omnistage.families.glm_image",
    "omnistage.families.whisper",
    "omnistage.families.hibari",
    "omnistage.families.wan",
    "omnistage.families.flux",
    "omnistage.families.sd3",
    "omnistage.families.qwen_image",
    "omnistage.families.stable_audio",
    "omnistage.families.z_image",
    "omnistage.families.flux2",
    "omnistage.families.hunyuan_video15",
    "omnistage.families.qwen_image_edit",
    "omnistage.families.ltx2",
    "omnistage.families.diffusers",
    "omnistage.families.llm",
)

Resolver = Callable[["ModelInfo"], PipelineSpec | None]
Source = Callable[[Path], Path | None]

_PIPELINES: dict[str, PipelineSpec] = {}
_RESOLVERS: list[tuple[int, str, Resolver]] = []
_SOURCES: dict[str, Source] = {}
_loaded = False
_loading = threading.RLock()  # a server starts its models in threads: each waits for one load


def add(spec: PipelineSpec) -> PipelineSpec:
    _PIPELINES[spec.name] = spec
    return spec


def add_resolver(name: str, resolver: Resolver, priority: int = 0) -> Resolver:
    """Resolvers run after exact matches, highest priority first; the first non-None answer wins."""
    _RESOLVERS[:] = [r for r in _RESOLVERS if r[1] != name]
    _RESOLVERS.append((priority, name, resolver))
    _RESOLVERS.sort(key=lambda r: -r[0])  # stable: equal priorities keep FAMILIES' order
    return resolver


def add_source(name: str, source: Source) -> Source:
    """`source(path)` returns the model directory `path` stands for, or None when it is not its format."""
    _SOURCES[name] = source
    return source


def load() -> None:
    """Register every family of `FAMILIES` (once per process)."""
    global _loaded
    with _loading:
        if _loaded:
            return
        for name in FAMILIES:
            importlib.import_module(name).register()
        _loaded = True


def pipelines() -> dict[str, PipelineSpec]:
    load()
    return dict(_PIPELINES)


def get(name: str) -> PipelineSpec:
    return pipelines()[name]


def resolvers() -> list[tuple[str, Resolver]]:
    load()
    return [(name, fn) for _, name, fn in _RESOLVERS]


def sources() -> list[tuple[str, Source]]:
    load()
    return list(_SOURCES.items())
