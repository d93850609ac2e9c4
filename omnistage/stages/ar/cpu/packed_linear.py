"""Prepacked linear weights on CPU.

At decode batch sizes (tens of rows) a plain `F.linear` re-lays the weight out for the GEMM kernel on
every call, which costs about as much as the multiplication itself; oneDNN can lay each weight out once,
at load time, and reuse it every step (the same trick vLLM's CPU backend and torch inductor's freezing
use). The model keeps its modules and original weights (tied embeddings still read them); each
`nn.Linear` just computes through its packed copy, which costs a second copy of the linear weights.
Weights changed after packing are not seen: pack after loading, never while training.

float32 weights are packed everywhere; bf16/fp16 ones where the CPU computes that type natively
(AVX512-BF16/AMX: on 2 such cores a bf16 GEMM at 32 rows runs 1.3-2x faster packed, 768->32000 1.56 ms
against 3.25 ms). Packed bf16 stays ahead at every size measured (1024 rows: 1.1-1.4x). In float32 a long
prefill (`PACKED_MAX_ROWS` rows on) takes oneDNN's packed copy too, as vLLM's CPU GEMM does at every size:
the plain GEMM rounds otherwise (on an AVX-512 Zen 4, Qwen3-TTS prefills batched past 256 rows changed one
request's codes against vLLM-Omni's at c=8) though it is a little faster there (1024 rows on 2 AVX2 cores:
169-182 against 152-155 GFLOP/s). Only where no oneDNN copy is kept (AVX2, below) does it take the plain
GEMM on the original weight.

Below a long prefill's rows a float32 linear computes through the native kernel (csrc/weight_only/
float_gemm.cpp, `float_linear`) on its own packed copy of the weight, where it is built: it sums exactly as
oneDNN's packed GEMM does on this CPU (bit for bit, tested; the k blocks oneDNN sums in differ between CPUs
and row counts, so `onednn_blocks` finds them by trying), so greedy tokens stay the ones a oneDNN server
picks even on a near tie (vLLM-Omni's CPU GEMM is oneDNN's); where oneDNN sums one row as it sums several
(on AVX2 always) a row's result does not depend on the batch around it either. It runs 1.5-5x faster at
1-16 rows (a Qwen3-Omni talker step of 8 sequences, its code predictor's 15 passes of small linears: 35 ->
25 ms), 1.0-1.3x at 17-128 rows and 0.9x at 255 on 2 AVX2 EPYC cores, where it replaces the oneDNN copy
outright (`NATIVE_MAX_ROWS`); on an AVX-512 Zen 4, 1.2-1.4x at one row and 1.3-2.9x at 2-8, 1.0-1.3x at
16, it takes up to 16 rows and oneDNN the rest.
`OMNISTAGE_NATIVE_KERNELS=0` (or no build) keeps every call on oneDNN.
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
PACKED_MAX_ROWS = 256  # float32 inputs this long take the original weight where no oneDNN copy is kept
# float32 inputs with at most this many rows use the native kernel (module docstring)
NATIVE_MAX_ROWS = PACKED_MAX_ROWS - 1 if torch.backends.cpu.get_cpu_capability() == "AVX2" else 16
PROBE_OUTPUTS = 96  # the output width `onednn_blocks` tries its blocks on
SPLIT_MAX_OUTPUTS = 64  # linears this narrow with K over 1024 stay on oneDNN (`native_linear`)
Joint = Callable[[torch.Tensor], tuple[torch.Tensor, ...]]  # one input → each fused linear's output


def packable_dtypes() -> set[torch.dtype]:
    """Weight dtypes this CPU runs faster packed: float32, and the half types it computes natively."""
    return {torch.float32} | {d for d in (torch.bfloat16, torch.float16) if cpu_has_native(d)}


def pack_linears(model: nn.Module, batch_hint: int = BATCH_HINT) -> int:
    """Route every CPU `nn.Linear` under `model` whose dtype `packable_dtypes()` names through a packed
    weight (the native kernel's and/or oneDNN's, see the module docstring); returns how many."""
    count, dtypes = 0, packable_dtypes()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if type(module) is not nn.Linear or weight.dtype not in dtypes or weight.device.type != "cpu":
            continue
        if is_quantized(module):
            continue
        bias = module.bias.detach() if module.bias is not None else None
        few_rows = native_linear(weight.detach(), bias)
        packed = None if _native_covers(few_rows) else onednn_copy(weight.detach(), batch_hint)
        module.forward = functools.partial(_packed_linear, packed, weight.detach(), bias, few_rows)
        count += 1
    logger.info("packed %d linear layers", count)
    return count


class JointLinear:
    """Packed linears that read the same input (q/k/v, gate/up) as one packed GEMM. Called, it returns each
    linear's output; `whole` returns them side by side in one tensor (what a fused pointwise kernel reads).
    oneDNN and the native kernel compute every output column from its own weight row, so the results are
    bit-identical to the separate packed calls (a test checks it); one call instead of several saves their
    fixed per-call cost at decode batch sizes."""

    def __init__(self, linears: tuple[nn.Module, ...]):
        self.widths = [int(m.weight.shape[0]) for m in linears]
        weight = torch.cat([m.weight.detach() for m in linears])
        self.bias = None if linears[0].bias is None else torch.cat([m.bias.detach() for m in linears])
        self.few_rows = native_linear(weight, self.bias)
        self.packed = None if _native_covers(self.few_rows) else onednn_copy(weight)
        del weight  # only the packed copies are kept (large inputs use each linear's own weight)
        self.originals = [(m.weight.detach(), None if m.bias is None else m.bias.detach()) for m in linears]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.packed is None and _plain_is_faster(x):
            return tuple(F.linear(x, w, b) for w, b in self.originals)
        return self.whole(x).split(self.widths, dim=-1)

    def whole(self, x: torch.Tensor) -> torch.Tensor:
        if self.few_rows is not None and _few_rows(x):
            return self.few_rows(x)
        if self.packed is None:
            return torch.cat([F.linear(x, w, b) for w, b in self.originals], dim=-1)
        return onednn_linear(self.packed, self.bias, x)


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
    """A long float32 input, where no oneDNN copy is kept (see the module docstring)."""
    return x.dtype == torch.float32 and _rows(x) >= PACKED_MAX_ROWS


def native_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Callable | None:
    """`x → x @ weight.T + bias` through the native kernel on a packed copy of `weight`, for float32 inputs
    of up to NATIVE_MAX_ROWS rows; None where it does not apply (not built or switched off, not float32
    weights on the CPU)."""
    kernels = native.weight_only_kernels()
    if kernels is None or weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        return None
    if bias is not None and bias.dtype != torch.float32:
        return None
    n, k = weight.shape
    if n <= SPLIT_MAX_OUTPUTS and k > 1024:
        return None  # oneDNN may split a single row's k across threads (seen on AVX-512): no block is that
    blocks = onednn_blocks(k)
    if blocks is None:
        return None
    bias = None if bias is None else bias.contiguous()
    return functools.partial(_native, kernels.float_linear, kernels.pack_float(weight), n, bias, blocks)


def _native_covers(few_rows: Callable | None) -> bool:
    """Whether the native kernel takes every input that would otherwise go to oneDNN's packed copy."""
    return few_rows is not None and NATIVE_MAX_ROWS >= PACKED_MAX_ROWS - 1


def onednn_copy(weight: torch.Tensor, batch_hint: int = BATCH_HINT) -> torch.Tensor:
    """oneDNN's packed layout of `weight`, for `onednn_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)


def onednn_blocks(k: int) -> tuple[int, int] | None:
    """The k blocks in which oneDNN's packed float32 GEMM (packed for BATCH_HINT rows) sums inputs `k` wide
    on this CPU, for one row and for more (float_gemm.cpp): found by computing random inputs both ways with
    each candidate block, because oneDNN's choice depends on the CPU (AVX2: 1024 k; an AVX-512 Zen 4: the
    whole of K up to 512, then 512, and 1024 from 1024 on for two rows or more). None where no candidate
    gives oneDNN's bits: such linears stay on oneDNN."""
    return _blocks_found(k, torch.get_num_threads())


@functools.cache
def _blocks_found(k: int, threads: int) -> tuple[int, int] | None:
    kernels = native.weight_only_kernels()
    gen = torch.Generator().manual_seed(k)
    weight = torch.randn(PROBE_OUTPUTS, k, generator=gen)
    onednn, panels = onednn_copy(weight), kernels.pack_float(weight)
    found = []
    for rows in ((1,), (2, 5, NATIVE_MAX_ROWS)):
        inputs = [torch.randn(r, k, generator=gen) for r in rows]
        wants = [onednn_linear(onednn, None, x) for x in inputs]
        candidates = [b for b in (1024, 512, max(k, 1)) if b % 256 == 0 or b >= k]
        block = next((b for b in candidates if _sums_as(kernels, panels, b, inputs, wants)), None)
        if block is None:
            logger.info("no native float32 block sums as oneDNN does for K=%d here: oneDNN computes it", k)
            return None
        found.append(block)
    return found[0], found[1]


def _sums_as(kernels, panels: torch.Tensor, block: int, inputs: list, wants: list) -> bool:
    """Whether the native kernel with `block` gives oneDNN's bits (`wants`) for every input."""
    got = (kernels.float_linear(x, panels, PROBE_OUTPUTS, None, block) for x in inputs)
    return all(map(torch.equal, got, wants))


def _native(
    kernel: Callable,
    panels: torch.Tensor,
    n: int,
    bias: torch.Tensor | None,
    blocks: tuple[int, int],
    x: torch.Tensor,
):
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = kernel(x2, panels, n, bias, blocks[0] if x2.shape[0] == 1 else blocks[1])
    return out.view(*x.shape[:-1], n)


def _packed_linear(
    packed: torch.Tensor | None,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    few_rows: Callable | None,
    x: torch.Tensor,
) -> torch.Tensor:
    if few_rows is not None and _few_rows(x):
        return few_rows(x)
    if packed is None:
        return F.linear(x, weight, bias)
    return onednn_linear(packed, bias, x)


def onednn_linear(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """`x @ W.T + bias` on W's `onednn_copy`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
