"""omnistage: disaggregated serving for any-to-any multimodal models, as graphs of stages."""

__version__ = "0.1.0"

from omnistage.api import AsyncOmni, Omni  # noqa: E402
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec  # noqa: E402
from omnistage.outputs import OmniRequestOutput, StageOutput  # noqa: E402
from omnistage.params import DiffusionParams, GenerationParams, SamplingParams  # noqa: E402
from omnistage.stages.base import StageRequest  # noqa: E402

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
