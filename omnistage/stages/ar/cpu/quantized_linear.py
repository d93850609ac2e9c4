"""Weight-only quantized linears for the AR engine's decoder (engine argument `quantization`).

A lone sequence's decode step reads every weight once and does little arithmetic with each: its time is
the bytes it reads. Int8 weights (one float scale per output row) read a quarter of float32's bytes, int4
(groups of `GROUP` input columns, a scale and a zero point each) an eighth. Activations stay float (bf16 or
float32) and the weights are widened inside torch's own CPU kernels (`aten._weight_int8pack_mm`,
`aten._weight_int4pack_mm_for_cpu`), so nothing but the weight changes: the rest of the step is as before.

A row of int4 weights is `w = (q - 8) * scale + zero` for q in 0..15, per group: the layout of GGUF's
Q4_0 (zero 0) and Q4_1 (`q * d + m`: zero = m + 8d), so those files' blocks load as they are
(`WeightOnly.int4`) instead of through float weights.
"""

from __future__ import annotations

import dataclasses
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("none", "int8", "int4")
GROUP = 32  # int4 input columns sharing a scale and a zero point (GGUF's block)


@dataclasses.dataclass
class WeightOnly:
    """A linear's quantized weight `[N, K]`, kernel-independent (so several can be joined along N first).
    int8: `q` int8, `scale` [N]. int4: `q` uint8 in 0..15, `scale` and `zero` [N, K / group]."""

    kind: str
    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None = None
    group: int = GROUP

    @staticmethod
    def int8(weight: torch.Tensor) -> WeightOnly:
        """Symmetric, one scale per output row (its largest magnitude maps to 127)."""
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return WeightOnly("int8", q, scale)

    @staticmethod
    def int4(weight: torch.Tensor, group: int = GROUP) -> WeightOnly:
        """Asymmetric per group: each group's min and max map onto 0 and 15."""
        w = weight.detach().float()
        n, k = w.shape
        if k % group:
            raise ValueError(f"int4 needs input width divisible by {group}; got {k}")
        g = w.view(n, k // group, group)
        low, high = g.amin(dim=2), g.amax(dim=2)
        scale = ((high - low) / 15.0).clamp(min=1e-12)
        q = torch.round((g - low[..., None]) / scale[..., None]).clamp(0, 15)
        zero = low + 8.0 * scale  # w = (q - 8) * scale + zero
        return WeightOnly("int4", q.view(n, k).to(torch.uint8), scale, zero, group)

    @staticmethod
    def of(weight: torch.Tensor, kind: str) -> WeightOnly:
        if kind == "int8":
            return WeightOnly.int8(weight)
        if kind == "int4":
            return WeightOnly.int4(weight)
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {kind!r}")

    @staticmethod
    def cat(parts: list[WeightOnly]) -> WeightOnly:
        """Several weights reading the same input as one (rows one after another)."""
        first = parts[0]
        if any(p.kind != first.kind or p.group != first.group for p in parts):
            raise ValueError("only weights quantized the same way can be joined")
        zero = None if first.zero is None else torch.cat([p.zero for p in parts])
        return WeightOnly(
            first.kind,
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            zero,
            first.group,
        )

    def dequantized(self) -> torch.Tensor:
        """The float32 weight this stands for (what the kernels compute with, before activation rounding)."""
        if self.kind == "int8":
            return self.q.float() * self.scale.float()[:, None]
        expand = lambda t: t.float().repeat_interleave(self.group, dim=1)  # noqa: E731
        return (self.q.float() - 8.0) * expand(self.scale) + expand(self.zero)

    @property
    def nbytes(self) -> int:
        bits = 8 if self.kind == "int8" else 4
        return self.q.numel() * bits // 8


class QuantizedLinear:
    """`x [..., K]` → `x @ W.T + b` through torch's weight-only CPU kernel, with the scales in `dtype` (the
    activations' dtype, which the kernels require to match)."""

    def __init__(self, weight: WeightOnly, bias: torch.Tensor | None, dtype: torch.dtype):
        self.kind, self.dtype, self.bias = weight.kind, dtype, bias
        self.out_features = int(weight.q.shape[0])
        if weight.kind == "int8":
            self.q, self.scale = weight.q.contiguous(), weight.scale.to(dtype).contiguous()
        else:
            self.group = weight.group
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight.q.to(torch.int32), 1)
            self.scales_and_zeros = torch.stack([weight.scale.t(), weight.zero.t()], dim=-1).to(dtype)
            self.scales_and_zeros = self.scales_and_zeros.contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if flat.dtype != self.dtype:
            flat = flat.to(self.dtype)
        if self.kind == "int8":
            out = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat, self.packed, self.group, self.scales_and_zeros
            )
        if self.bias is not None:
            out = out + self.bias
        return out.view(*shape[:-1], self.out_features).to(x.dtype)


def quantize_linears(
    model: nn.Module, kind: str, dtype: torch.dtype, skip: tuple[nn.Module, ...] = ()
) -> int:
    """Route every `nn.Linear` under `model` (but those in `skip`, e.g. a tied output head) through a
    weight-only quantized copy of its weight, and free the float weight; returns how many. A linear that
    carries `weight_only` (set by a loader that read quantized blocks from its file) keeps those."""
    if kind not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {kind!r}")
    if kind == "none":
        return 0
    skipped = {id(m) for m in skip}
    count = 0
    for module in model.modules():
        if type(module) is not nn.Linear or id(module) in skipped or module.weight.device.type != "cpu":
            continue
        if module.in_features % GROUP and kind == "int4":
            continue  # the kernel's groups must tile the input
        weight = getattr(module, "weight_only", None) or WeightOnly.of(module.weight, kind)
        bias = None if module.bias is None else module.bias.detach().to(dtype)
        module.weight_only = weight
        module.forward = QuantizedLinear(weight, bias, dtype)
        module.weight = nn.Parameter(torch.empty(0, dtype=module.weight.dtype), requires_grad=False)
        count += 1
    logger.info("quantized %d linear layers to %s weights", count, kind)
    return count


def is_quantized(module: nn.Module) -> bool:
    return isinstance(module.__dict__.get("forward"), QuantizedLinear)


class QuantizedJoint:
    """Quantized linears that read the same input (q/k/v, gate/up) as one kernel call, with JointLinear's
    interface (packed_linear.py): called, each linear's output; `whole`, all of them side by side."""

    def __init__(self, linears: tuple[nn.Module, ...]):
        first = linears[0].forward
        self.widths = [int(m.forward.out_features) for m in linears]
        biases = [m.forward.bias for m in linears]
        bias = None if biases[0] is None else torch.cat(biases)
        self.linear = QuantizedLinear(WeightOnly.cat([m.weight_only for m in linears]), bias, first.dtype)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.whole(x).split(self.widths, dim=-1)

    def whole(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)
