"""The models one server serves, by name, and how a request's `model` field picks one."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from omnistage.config.capabilities import Capabilities, Limits
from omnistage.config.pipeline import PipelineSpec, StageSpec
from omnistage.errors import InvalidRequestError, NotFoundError
from omnistage.serving.limits import effective_limits
from omnistage.serving.settings import ServerSettings

if TYPE_CHECKING:
    from omnistage.api import AsyncOmni

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class ServedModel:
    name: str
    omni: AsyncOmni
    pipeline: PipelineSpec = None  # type: ignore[assignment]  # taken from the runtime when not given
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if self.pipeline is None:
            self.pipeline = self.omni.pipeline

    @property
    def stages(self) -> list[StageSpec]:
        return sorted(self.pipeline.stages, key=lambda s: s.stage_id)

    @property
    def modalities(self) -> tuple[str, ...]:
        return self.pipeline.modalities

    def produces(self, modality: str) -> bool:
        return modality in self.modalities

    @property
    def capabilities(self) -> Capabilities:
        """What the model serves; the runtime's (with its deploy's limits) when there is one."""
        caps = getattr(self.omni, "capabilities", None)
        return caps if isinstance(caps, Capabilities) else self.pipeline.capabilities

    def limits(self, settings: ServerSettings) -> Limits:
        return effective_limits(self.capabilities.limits, settings)

    def default_fields(self, stage_id: int) -> dict[str, Any]:
        """The fields stage `stage_id`'s defaults name (pipeline defaults < deploy YAML)."""
        fields = getattr(self.omni, "default_fields", None)
        return fields(stage_id) if fields else dict(self.pipeline.stage(stage_id).default_params)

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The model directory's tokenizer (token strings of logprobs, prompt lengths); None without one."""
        model_dir = getattr(self.omni, "model_dir", None)
        if not model_dir:
            return None
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(model_dir)
        except Exception as exc:  # a directory without a tokenizer (a diffusers pipeline, a toy)
            logger.info("no tokenizer for %s: %s", self.name, exc)
            return None

    def default_modalities(self) -> list[str]:
        return list(self.pipeline.default_modalities or self.modalities)


class ServedModels:
    """Name → model. A request without `model` goes to the first model that can answer the route."""

    def __init__(self, models: Mapping[str, AsyncOmni] | Sequence[AsyncOmni]):
        if isinstance(models, Mapping):
            items = list(models.items())
        else:
            items = [(m.model_name, m) for m in models]
        self.models: dict[str, ServedModel] = {}
        for name, omni in items:
            if name in self.models:
                raise ValueError(f"two served models are named {name!r}; give them distinct names")
            self.models[name] = ServedModel(name=name, omni=omni)

    def __iter__(self):
        return iter(self.models.values())

    def __len__(self) -> int:
        return len(self.models)

    def get(
        self, name: str | None, *, produces: Sequence[str] = (), route: str = "", serves: str | None = None
    ) -> ServedModel:
        """The model named `name` (404 if unknown); 400 if it does not serve the route `serves` (a
        `Capabilities` route) or cannot produce `produces` for it."""
        if name is not None and name not in self.models:
            raise NotFoundError(f"The model `{name}` does not exist.", param="model")
        if name is None:
            for model in self.models.values():
                if all(model.produces(m) for m in produces) and (
                    serves is None or model.capabilities.serves(serves)
                ):
                    return model
            served = ", ".join(f"{m.name} ({'/'.join(m.modalities)})" for m in self.models.values()) or "none"
            raise InvalidRequestError(f"no served model can answer {route}; served: {served}", param="model")
        model = self.models[name]
        if serves is not None and not model.capabilities.serves(serves):
            raise InvalidRequestError(
                f"model {name!r} does not serve {route} (it serves {', '.join(model.capabilities.routes)})",
                param="model",
            )
        missing = [m for m in produces if not model.produces(m)]
        if missing:
            raise InvalidRequestError(
                f"model {name!r} cannot serve {route}: it produces {'/'.join(model.modalities)}, not "
                f"{'/'.join(missing)}",
                param="model",
            )
        return model

    def describe(self) -> list[dict[str, Any]]:
        """The OpenAI model list entries, plus what each model produces."""
        return [
            {
                "id": m.name,
                "object": "model",
                "created": m.created,
                "owned_by": "omnistage",
                "root": str(getattr(m.omni, "model_dir", "") or m.name),
                "modalities": list(m.modalities),
                "routes": list(m.capabilities.routes),
                "stages": [{"stage_id": s.stage_id, "name": s.name, "kind": str(s.kind)} for s in m.stages],
            }
            for m in self.models.values()
        ]
