"""Model directory → pipeline: read what the directory says about itself and ask the registry."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

from omnistage.config.pipeline import PipelineSpec
from omnistage.errors import ConfigError
from omnistage.families import registry

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ModelInfo:
    path: Path
    config: dict[str, Any] | None = None
    model_index: dict[str, Any] | None = None

    @classmethod
    def read(cls, path: str | Path) -> ModelInfo:
        path = Path(path).expanduser().resolve()
        if not path.exists():
            raise ConfigError(f"model {path} does not exist (omnistage never downloads models)")
        info = cls(path=path)
        if path.is_dir():
            for name, attr in (("config.json", "config"), ("model_index.json", "model_index")):
                file = path / name
                if file.exists():
                    try:
                        setattr(info, attr, json.loads(file.read_text()))
                    except json.JSONDecodeError as exc:
                        raise ConfigError(f"{file} is not valid JSON: {exc}") from exc
        return info

    @property
    def model_type(self) -> str | None:
        return (self.config or {}).get("model_type")

    @property
    def architectures(self) -> list[str]:
        return list((self.config or {}).get("architectures") or [])

    @property
    def diffusers_class(self) -> str | None:
        return (self.model_index or {}).get("_class_name")


def match(spec: PipelineSpec, info: ModelInfo) -> bool:
    if info.diffusers_class and info.diffusers_class in spec.diffusers_classes:
        return True
    if info.model_type and info.model_type in spec.model_types:
        return True
    return bool(set(info.architectures) & set(spec.architectures))


def model_directory(model: str | Path) -> Path:
    """The standard model directory `model` stands for: itself, or what a registered source converts it
    to (e.g. a GGUF file becomes a safetensors directory in the cache)."""
    path = Path(model).expanduser().resolve()
    if not path.exists():
        raise ConfigError(f"model {path} does not exist (omnistage never downloads models)")
    for name, source in registry.sources():
        converted = source(path)
        if converted is not None:
            logger.info("model %s (%s) is served from %s", path, name, converted)
            return converted
    return path


def resolve_pipeline(model: str | Path) -> tuple[PipelineSpec, ModelInfo]:
    """The pipeline that serves `model`, or a ConfigError saying what the directory looked like."""
    info = ModelInfo.read(model_directory(model))
    for spec in registry.pipelines().values():
        if match(spec, info):
            return spec, info
    for _, resolver in registry.resolvers():
        spec = resolver(info)
        if spec is not None:
            return spec, info
    seen = info.diffusers_class or info.model_type or (info.architectures or ["nothing recognisable"])[0]
    raise ConfigError(
        f"no omnistage pipeline serves {info.path} ({seen}); "
        f"known pipelines: {', '.join(sorted(registry.pipelines())) or 'none'}"
    )
