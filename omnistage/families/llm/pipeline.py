"""Plain LLMs: any `...ForCausalLM` checkpoint (Qwen2, Qwen3, Llama, ...) is one AR stage producing text.

Registered as a low-priority resolver so that a family with its own pipeline for the same architecture
(e.g. an omni thinker) wins.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from omnistage.config.capabilities import Capabilities
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py

if TYPE_CHECKING:
    from omnistage.families.resolve import ModelInfo

LLM_PIPELINE = PipelineSpec(
    name="llm",
    stages=(StageSpec(stage_id=0, name="llm", kind=StageKind.AR, final_output=True, output_modality="text"),),
    default_deploy=str(HERE / "llm.yaml"),
    family=FAMILY,
    # Chat and completions; a reply without max_tokens runs to the engine's context (max_model_len, from
    # the config's max_position_embeddings unless the deploy sets it) minus the prompt.
    # Tools: written in by the model's chat template, or in Hermes form where the template has no tools
    # (omnistage/tool_prompts.py); --tool-call-parser json for a template that asks for bare JSON calls.
    capabilities=Capabilities(
        routes=("chat", "completions"), prompt="chat", fields={"sampling": (0,)}, tool_parser="hermes"
    ),
)


def resolve_llm(info: ModelInfo) -> PipelineSpec | None:
    """A directory whose config names a causal-LM architecture transformers can load."""
    if info.config is None or not any(a.endswith("ForCausalLM") for a in info.architectures):
        return None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return LLM_PIPELINE if info.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else None
