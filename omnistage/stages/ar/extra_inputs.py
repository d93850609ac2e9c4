"""Forward inputs a family's decoder takes besides the engine's own, built per step from its requests.

A family registers a builder for the type of its request extension (`ARInputs.extension`) that carries the
data (a vision encoder's DeepStack features, say); in a step where any request carries one, the model
runner calls the builder with the step's batch and passes what it returns to the decoder as keyword
arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# builder(batch: list[ScheduledSeq], offsets: row of each item, total rows, device) -> decoder kwargs
Builder = Callable[[list[Any], list[int], int, torch.device], dict[str, Any]]

_BUILDERS: dict[type, Builder] = {}


def register_extra_input(extension: type, builder: Builder) -> Builder:
    """`builder` runs in steps where a request's `ARInputs.extension` is an `extension`."""
    _BUILDERS[extension] = builder
    return builder


def extra_forward_kwargs(batch: list[Any], offsets: list[int], total: int, device: torch.device) -> dict:
    kwargs: dict[str, Any] = {}
    for kind, builder in _BUILDERS.items():
        if any(isinstance(item.seq.request.inputs.extension, kind) for item in batch):
            kwargs.update(builder(batch, offsets, total, device))
    return kwargs
