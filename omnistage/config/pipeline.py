"""Model topology: which stages exist, what each runs, how they connect.

Owned by a model family in Python and never taken from user YAML; deployment (placement, devices,
batch sizes) lives in `deploy.py`.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnistage.config.capabilities import Capabilities, derive_capabilities
from omnistage.errors import ConfigError


class StageKind(enum.StrEnum):
    AR = "ar"
    GENERATION = "generation"
    DIFFUSION = "diffusion"


DEFAULT_ENGINES = {
    StageKind.AR: "omnistage.stages.ar.engine:create_engine",
    StageKind.GENERATION: "omnistage.stages.generation.engine:create_engine",
    StageKind.DIFFUSION: "omnistage.stages.diffusion.engine:create_engine",
}

MODALITIES = ("text", "audio", "image", "video", "latent")

# A function given by object or by "module:qualname"; objects are turned into paths for subprocesses.
Ref = str | Callable[..., Any] | None


@dataclasses.dataclass(frozen=True)
class StageSpec:
    stage_id: int
    name: str
    kind: StageKind
    inputs: tuple[int, ...] = ()
    final_output: bool = False
    output_modality: str | None = None
    # fn(ctx: StageInputContext) -> StageRequest; None: pass the user's prompt and params through.
    input_processor: Ref = None
    # fn(ctx: StageInputContext, chunk: StageOutput, last: bool) -> StageRequest (the first), the engine's
    # inputs struct with what is new, or None (nothing new yet)
    chunk_processor: Ref = None
    # fn(ctx: EngineContext) -> StageEngine; None: the default engine of `kind`.
    engine: Ref = None
    model_subfolder: str | None = None
    submodule: str | None = None
    # Parameter values the model needs whatever the user asks (e.g. codec stop ids).
    sampling_constraints: dict[str, Any] = dataclasses.field(default_factory=dict)
    default_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    engine_args: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", StageKind(self.kind))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        if self.final_output and self.output_modality not in MODALITIES:
            raise ConfigError(
                f"stage {self.stage_id} ({self.name}): a final stage needs output_modality in {MODALITIES}"
            )

    @property
    def engine_ref(self) -> Ref:
        return self.engine or DEFAULT_ENGINES[self.kind]


@dataclasses.dataclass(frozen=True)
class PipelineSpec:
    name: str
    stages: tuple[StageSpec, ...]
    # How a model directory is matched: config.json model_type / architectures, model_index.json _class_name.
    model_types: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    diffusers_classes: tuple[str, ...] = ()
    # The family's bundled deploy YAML (a path).
    default_deploy: str | None = None
    # The family's `register()` (omnistage/families/registry.py): a stage process calls it before building
    # its engine, so the family's entries in the engines' registries are there.
    family: Ref = None
    default_modalities: tuple[str, ...] | None = None
    # What the pipeline serves over HTTP (routes, prompt shape, field → stage mapping, limits, voices);
    # None: derived from the topology (config/capabilities.py).
    capabilities: Capabilities | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        errors = self.validation_errors()
        if errors:
            raise ConfigError(f"pipeline {self.name!r}: " + "; ".join(errors))
        if self.capabilities is None:
            object.__setattr__(self, "capabilities", derive_capabilities(self))
        errors = self.capabilities.validate_for(self)
        if errors:
            raise ConfigError(f"pipeline {self.name!r}: " + "; ".join(errors))

    def validation_errors(self) -> list[str]:
        errors = []
        ids = [s.stage_id for s in self.stages]
        if not self.stages:
            errors.append("has no stages")
        if len(set(ids)) != len(ids):
            errors.append(f"stage ids must be unique, got {ids}")
        for s in self.stages:
            for src in s.inputs:
                if src == s.stage_id:
                    errors.append(f"stage {s.stage_id} lists itself as input")
                elif src not in ids:
                    errors.append(f"stage {s.stage_id} input {src} is not a stage")
        if self.stages and not any(not s.inputs for s in self.stages):
            errors.append("needs at least one entry stage (no inputs)")
        if self.stages and not any(s.final_output for s in self.stages):
            errors.append("needs at least one final_output stage")
        if not errors and self._has_cycle():
            errors.append("stage inputs form a cycle")
        return errors

    def _has_cycle(self) -> bool:
        deps = {s.stage_id: set(s.inputs) for s in self.stages}
        done: set[int] = set()
        while deps:
            ready = [sid for sid, d in deps.items() if d <= done]
            if not ready:
                return True
            for sid in ready:
                done.add(sid)
                del deps[sid]
        return False

    def stage(self, stage_id: int) -> StageSpec:
        for s in self.stages:
            if s.stage_id == stage_id:
                return s
        raise KeyError(stage_id)

    def consumers(self, stage_id: int) -> list[StageSpec]:
        return [s for s in self.stages if stage_id in s.inputs]

    @property
    def final_stages(self) -> list[StageSpec]:
        return [s for s in self.stages if s.final_output]

    @property
    def modalities(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s.output_modality for s in self.final_stages))

    def stages_for(self, modalities: tuple[str, ...] | list[str] | None) -> tuple[set[int], set[int]]:
        """(stages that must run, final stages whose outputs the caller gets) for requested modalities."""
        wanted = tuple(modalities or self.default_modalities or self.modalities)
        unknown = [m for m in wanted if m not in self.modalities]
        if unknown:
            from omnistage.errors import InvalidRequestError

            raise InvalidRequestError(
                f"modalities {unknown} not produced by {self.name!r} (it produces {list(self.modalities)})",
                param="modalities",
            )
        finals = {s.stage_id for s in self.final_stages if s.output_modality in wanted}
        needed: set[int] = set()
        todo = list(finals)
        while todo:
            sid = todo.pop()
            if sid not in needed:
                needed.add(sid)
                todo.extend(self.stage(sid).inputs)
        return needed, finals


def ref_to_path(ref: Ref) -> str | None:
    """A function reference as "module:qualname", importable in a fresh process."""
    if ref is None or isinstance(ref, str):
        return ref
    module = ref.__module__
    if module == "__main__":
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if not main_file:
            raise ConfigError(f"{ref!r} is defined in an interactive __main__; move it into a module")
        module = "file:" + str(Path(main_file).resolve())
    return f"{module}:{ref.__qualname__}"


def register_family(family: Ref) -> None:
    """Run a family's `register()` (a pipeline's `family`): its entries in the engines' registries."""
    fn = load_ref(family)
    if fn is not None:
        fn()


def load_ref(ref: Ref) -> Callable[..., Any] | None:
    """Resolve "module:qualname" (or "file:/path.py:qualname") to the object."""
    if ref is None or callable(ref):
        return ref
    module_name, _, qualname = ref.rpartition(":")
    if not module_name:
        raise ConfigError(f"{ref!r} is not a 'module:function' reference")
    if module_name.startswith("file:"):
        path = module_name[5:]
        alias = "__omnistage_main__"
        module = sys.modules.get(alias)
        if module is None or getattr(module, "__file__", None) != path:
            spec = importlib.util.spec_from_file_location(alias, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[alias] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
