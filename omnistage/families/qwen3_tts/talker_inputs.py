"""The Qwen3 talkers' extension of the AR engine's inputs (ARInputs.extension), shared by Qwen3-TTS and
Qwen3-Omni: the text rows still to feed, one per generated frame."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch


@dataclasses.dataclass
class TalkerText:
    """`trailing_text` [R, H]: the rows frame 0, 1, … are fed with (streamed chunks append rows);
    `tts_pad_embed` [H]: the row every later frame is fed with. `subtalker`: Qwen3-TTS's code predictor
    sampling for this request (None: greedy)."""

    trailing_text: torch.Tensor
    tts_pad_embed: torch.Tensor | None = None
    subtalker: Any = None
