"""What TeaCache knows about a transformer class, as its family registers it.

TeaCache skips a step while the first block's timestep-modulated input has moved little since the last
computed step. Two things about that depend on the model: how its first block modulates its input (the
generic rule, an AdaLayerNormZero `norm1` that takes `emb`, lives in cache.py; blocks that modulate otherwise
need their own function), and the polynomial, fitted per model, that rescales the input's relative change
into an estimate of the output's (none: the raw change). A family registers both under its transformer's
class name; a transformer nobody registered gets the generic rule and the raw change.

Kept apart from cache.py so that registering imports no diffusers: a family's `register()` runs whenever a
model directory is resolved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch

# (first block, its hidden_states input, its temb input) → the tensor whose change TeaCache measures.
ModulatedInput = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class TeaCacheRule:
    coefficients: list[float] | None = None
    modulated_input: ModulatedInput | None = None


_RULES: dict[str, TeaCacheRule] = {}


def register_teacache(
    transformer_class: str,
    coefficients: Sequence[float] | None = None,
    modulated_input: ModulatedInput | None = None,
) -> None:
    """TeaCache's rescaling polynomial (highest power first, 5 numbers) and/or modulated-input function for
    the transformer class called `transformer_class`; what is not given stays as registered before."""
    before = _RULES.get(transformer_class, TeaCacheRule())
    _RULES[transformer_class] = TeaCacheRule(
        list(coefficients) if coefficients is not None else before.coefficients,
        modulated_input or before.modulated_input,
    )


def teacache_rule(transformer_class: str) -> TeaCacheRule:
    return _RULES.get(transformer_class, TeaCacheRule())
