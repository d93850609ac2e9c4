"""`ARInputs`: what an AR request carries besides its prompt and parameters (stages/typed_inputs.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass
class ARInputs:
    """`inputs_embeds` ([L, H]) replaces the prompt's embedding lookup; `position_ids` ([L] or [R, L]) and
    `rope_delta` give multimodal positions (columns past the prompt's position the first generated tokens,
    for a family whose output has a planned layout: GLM-Image's image grids); `encoder_hidden_states` (one
    [S, H] tensor, or one per sequence) is what a cross-attending decoder attends; `output_data` is copied
    into the request's first output's `data` (facts an input processor computed, for downstream stages).
    `extension` is the family's own inputs (a dataclass it owns), read by its step hooks and extra-input
    builders and grown by streamed chunks. `guidance` (guidance.py): classifier-free guidance, what the
    request's unconditional twin sees. `head`: one of the loaded model's other heads by name
    (`LoadedModel.heads`), that the request's tokens come from. `input_finished` is the engine's: False
    while a streaming request's input still arrives."""

    inputs_embeds: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    rope_delta: int = 0
    encoder_hidden_states: Any = None
    output_data: dict[str, Any] = dataclasses.field(default_factory=dict)
    extension: Any = None
    guidance: Any = None
    head: str | None = None
    input_finished: bool = True
