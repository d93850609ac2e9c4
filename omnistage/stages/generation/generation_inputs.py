"""`GenerationInputs`: what a generation request decodes (stages/typed_inputs.py)."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class GenerationInputs:
    """`frames`: the input frames (codes [T] or [T, Q], audio samples, …; None: the prompt's token ids).
    `context_frames`: the first N frames are context only (e.g. a cloned voice's reference clip codes the
    model continues): decoded as left context, never emitted. `first_chunk_frames`: this request's first
    chunk size under async chunk (0: the regular chunk; None: the engine's choice)."""

    frames: Any = None
    context_frames: int = 0
    first_chunk_frames: int | None = None
