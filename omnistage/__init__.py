"""omnistage: disaggregated serving for any-to-any multimodal models, as graphs of stages.

The public names load on first use (PEP 562), so `omnistage --version` and a mistyped flag answer at
once instead of importing torch first."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_HOMES = {
    "AsyncOmni": "omnistage.api",
    "Omni": "omnistage.api",
    "PipelineSpec": "omnistage.config.pipeline",
    "StageKind": "omnistage.config.pipeline",
    "StageSpec": "omnistage.config.pipeline",
    "OmniRequestOutput": "omnistage.outputs",
    "StageOutput": "omnistage.outputs",
    "DiffusionParams": "omnistage.params",
    "GenerationParams": "omnistage.params",
    "SamplingParams": "omnistage.params",
    "StageRequest": "omnistage.stages.base",
}

__all__ = [
    "AsyncOmni",
    "Omni",
    "PipelineSpec",
    "StageKind",
    "StageSpec",
    "OmniRequestOutput",
    "StageOutput",
    "DiffusionParams",
    "GenerationParams",
    "SamplingParams",
    "StageRequest",
    "__version__",
]

if TYPE_CHECKING:
    from omnistage.api import AsyncOmni, Omni
    from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
    from omnistage.outputs import OmniRequestOutput, StageOutput
    from omnistage.params import DiffusionParams, GenerationParams, SamplingParams
    from omnistage.stages.base import StageRequest


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'omnistage' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
