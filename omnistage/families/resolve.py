"""Model directory → pipeline: read what the directory says about itself and ask the registry."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
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
    hub_id: str | None = None  # the hub id ("ORG/NAME") the directory is the cached snapshot of

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


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_cache() -> Path:
    """The local Hugging Face hub cache, as huggingface_hub lays it out: HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub (read now, so a test's or a user's environment applies)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home).expanduser() / "hub"


def hub_snapshot(model: str | Path) -> Path | None:
    """The cached snapshot a hub id ("ORG/NAME") names, without the network (its `refs/main` commit, as
    `snapshot_download(local_files_only=True)` finds it); None when `model` is no hub id or an existing
    path. A hub id with nothing in the cache is a ConfigError naming where it looked."""
    text = str(model)
    if not _HUB_ID.match(text) or Path(text).expanduser().exists():
        return None
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache()
    try:
        return Path(snapshot_download(text, cache_dir=str(cache), local_files_only=True))
    except LocalEntryNotFoundError:
        folder = cache / f"models--{text.replace('/', '--')}"
        raise ConfigError(
            f"model {text!r} is not a path, and the local Hugging Face cache has no snapshot of it (looked "
            f"in {folder}); omnistage never downloads models: place the weights there (or pass a directory)"
        ) from None


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
    """The pipeline that serves `model` (a path, or a hub id cached locally: `hub_snapshot`), or a
    ConfigError saying what the directory looked like."""
    snapshot = hub_snapshot(model)
    info = ModelInfo.read(model_directory(snapshot or model))
    info.hub_id = str(model) if snapshot is not None else None
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
