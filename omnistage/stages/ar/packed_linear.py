"""Prepacked linear weights on CPU.

At decode batch sizes (tens of rows) a plain `F.linear` re-lays the weight out for the GEMM kernel on
every call, which costs about as much as the multiplication itself; oneDNN can lay each weight out once,
at load time, and reuse it every step (the same trick vLLM's CPU backend and torch inductor's freezing
use). The model keeps its modules and original weights (tied embeddings still read them); each
`nn.Linear` just computes through its packed copy, which costs a second copy of the linear weights.
Weights changed after packing are not seen: pack after loading, never while training.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack_linears(model: nn.Module, batch_hint: int = 32) -> int:
    """Route every float32 CPU `nn.Linear` under `model` through a oneDNN-packed weight; returns how many."""
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(module) is not nn.Linear or weight.dtype != torch.float32 or weight.device.type != "cpu":
            continue
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
        bias = module.bias.detach() if module.bias is not None else None
        module.forward = functools.partial(_packed_linear, packed, bias)
        count += 1
    logger.info("packed %d linear layers for oneDNN", count)
    return count


def _packed_linear(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
