"""Prepacked linear weights on CPU.

At decode batch sizes (tens of rows) a plain `F.linear` re-lays the weight out for the GEMM kernel on
every call, which costs about as much as the multiplication itself; oneDNN can lay each weight out once,
at load time, and reuse it every step (the same trick vLLM's CPU backend and torch inductor's freezing
use). The model keeps its modules and original weights (tied embeddings still read them); each
`nn.Linear` just computes through its packed copy, which costs a second copy of the linear weights.
Weights changed after packing are not seen: pack after loading, never while training.

float32 weights are packed everywhere; bf16/fp16 ones where the CPU computes that type natively
(AVX512-BF16/AMX: on 2 such cores a bf16 GEMM at 32 rows runs 1.3-2x faster packed, 768->32000 1.56 ms
against 3.25 ms). In float32, from `PACKED_MAX_ROWS` rows on (a long prefill) the plain GEMM on the
original weight is the faster one again (1024 rows on 2 AVX2 cores: 169-182 against 152-155 GFLOP/s), so
large float32 inputs take it; packed bf16 stays ahead at every size measured (1024 rows: 1.1-1.4x).

At a decode step's few rows (up to `NATIVE_MAX_ROWS`) a float32 linear computes through the native kernel
(csrc/weight_only/, `float_linear`) on its original weight where it is built: oneDNN's GEMM, laid out for
blocks of rows, takes 1.2-4x as long there (8 rows on an AVX2 EPYC core: 256->1024 60 against 92 us,
128->256 9 against 34 us); a Qwen3-Omni talker step of 8 sequences (its code predictor's 15 passes of small
linears) went from 35 to 25.5 ms. Its sums run in another order than oneDNN's: results differ from it by
float32 rounding, which can move a greedy pick on a near tie (one Qwen3-TTS request of 8 against vLLM-Omni,
whose CPU GEMM is oneDNN's). Each row is summed in one order whatever the batch, so a row's result is the same
alone and batched. Not for weights past `NATIVE_MAX_WEIGHT` elements (a large vocabulary's
head streams from memory either way, and oneDNN's reads keep ahead: 576->49152 at 8 rows 13.0 against
14.5 ms), nor for input widths the kernel's groups of 32 do not divide. `OMNISTAGE_NATIVE_KERNELS=0` (or no
build) keeps every call on the packed weights.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.stages.ar.cpu import native
from omnistage.stages.ar.cpu.quantized_linear import QuantizedJoint, is_quantized
from omnistage.stages.ar.loader import cpu_has_native

logger = logging.getLogger(__name__)


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


BATCH_HINT = 32  # rows the packed layout is tuned for
PACKED_MAX_ROWS = 256  # inputs with at least this many rows use the original weight
NATIVE_MAX_ROWS = 16  # float32 inputs with at most this many rows use the native kernel (module docstring)
NATIVE_MAX_WEIGHT = 16 * 2**20  # elements of the largest weight it takes
Joint = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]  # one input → each fused linear's output


def packable_dtypes() -> set[torch.dtype]:
    """Weight dtypes this CPU runs faster packed: float32, and the half types it computes natively."""
    return {torch.float32} | {d for d in (torch.bfloat16, torch.float16) if cpu_has_native(d)}


def pack_linears(model: nn.Module, batch_hint: int = BATCH_HINT) -> int:
    """Route every CPU `nn.Linear` under `model` whose dtype `packable_dtypes()` names through a
    oneDNN-packed weight; returns how many."""
    count, dtypes = 0, packable_dtypes()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(module) is not nn.Linear or weight.dtype not in dtypes or weight.device.type != "cpu":
            continue
        if is_quantized(module):
            continue
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
        bias = module.bias.detach() if module.bias is not None else None
        few_rows = native_linear([weight.detach()], bias)
        module.forward = functools.partial(_packed_linear, packed, weight.detach(), bias, few_rows)
        count += 1
    logger.info("packed %d linear layers for oneDNN", count)
    return count


class JointLinear:
    """Packed linears that read the same input (q/k/v, gate/up) as one packed GEMM. Called, it returns each
    linear's output; `whole` returns them side by side in one tensor (what a fused pointwise kernel reads).
    oneDNN computes every output column from its own weight row, so the results are bit-identical to the
    separate packed calls (a test checks it); one call instead of several saves their fixed per-call cost
    at decode batch sizes."""

    def __init__(self, linears: tuple[nn.Module, ...]):
        self.widths = [int(m.weight.shape[0]) for m in linears]
        weight = torch.cat([m.weight.detach() for m in linears])
        self.bias = None if linears[0].bias is None else torch.cat([m.bias.detach() for m in linears])
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, BATCH_HINT)
        del weight  # only the packed copy is kept (large inputs use each linear's own weight)
        self.originals = [(m.weight.detach(), None if m.bias is None else m.bias.detach()) for m in linears]
        self.few_rows = native_linear([w for w, _ in self.originals], self.bias)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if _plain_is_faster(x):
            return tuple(F.linear(x, w, b) for w, b in self.originals)
        return self.whole(x).split(self.widths, dim=-1)

    def whole(self, x: torch.Tensor) -> torch.Tensor:
        if self.few_rows is not None and _few_rows(x):
            return self.few_rows(x)
        if _plain_is_faster(x):
            return torch.cat([F.linear(x, w, b) for w, b in self.originals], dim=-1)
        return _pointwise(self.packed, self.bias, x)


def fuse_packed(*linears: nn.Module) -> JointLinear | QuantizedJoint | None:
    """The joint GEMM of packed (or all weight-only quantized) linears sharing their input; None unless all
    of them are. Each
    linear's own forward then takes its part of the joint GEMM, so their separate packed copies are freed
    (same results, same memory)."""
    biases = [m.bias for m in linears]
    if len({b is None for b in biases}) > 1:
        return None
    if all(is_quantized(m) for m in linears) and len({m.weight_only.kind for m in linears}) == 1:
        joint: Joint = QuantizedJoint(linears)
    elif all(_is_packed(m) for m in linears):
        joint = JointLinear(linears)
    else:
        return None
    for i, module in enumerate(linears):
        module.forward = functools.partial(_part_of, joint, i)
    return joint


def _part_of(joint: Joint, i: int, x: torch.Tensor) -> torch.Tensor:
    return joint(x)[i]


def _is_packed(module: nn.Module) -> bool:
    forward = module.__dict__.get("forward")
    return isinstance(forward, functools.partial) and forward.func is _packed_linear


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _few_rows(x: torch.Tensor) -> bool:
    """A decode step's float32 input, for the native kernel (see the module docstring)."""
    return x.dtype == torch.float32 and _rows(x) <= NATIVE_MAX_ROWS


def _plain_is_faster(x: torch.Tensor) -> bool:
    """A long float32 input (see the module docstring)."""
    return x.dtype == torch.float32 and _rows(x) >= PACKED_MAX_ROWS


def native_linear(weights: list[torch.Tensor], bias: torch.Tensor | None) -> Callable | None:
    """`x → x @ [w_0; w_1; ...].T + bias` through the native kernel, for float32 inputs of few rows; None
    where it does not apply (not built or switched off, not float32 weights on the CPU, an input width it
    cannot take, a weight past NATIVE_MAX_WEIGHT)."""
    kernels = native.weight_only_kernels()
    fits = all(
        w.dtype == torch.float32
        and w.device.type == "cpu"
        and w.is_contiguous()
        and w.shape[1] % 32 == 0
        and w.numel() <= NATIVE_MAX_WEIGHT
        for w in weights
    )
    if kernels is None or not fits or len({w.shape[1] for w in weights}) != 1:
        return None
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        return None
    return functools.partial(_native, kernels.float_linear, weights, bias)


def _native(kernel: Callable, weights: list[torch.Tensor], bias: torch.Tensor | None, x: torch.Tensor):
    out = kernel(x.reshape(-1, x.shape[-1]).contiguous(), weights, bias)
    return out.view(*x.shape[:-1], out.shape[-1])


def _packed_linear(
    packed: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    few_rows: Callable | None,
    x: torch.Tensor,
) -> torch.Tensor:
    if few_rows is not None and _few_rows(x):
        return few_rows(x)
    if _plain_is_faster(x):
        return F.linear(x, weight, bias)
    return _pointwise(packed, bias, x)


def _pointwise(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
