"""Weight-only quantized linears for the AR engine (engine argument `quantization`).

A lone sequence's decode step reads every weight once and does little arithmetic with each: its time is
the bytes it reads. The weights are kept in llama.cpp's block forms, groups of `GROUP` input columns each
with its own scale: int8 `w = q * scale` (GGUF's Q8_0, a quarter of float32's bytes) and int4
`w = q * scale + offset`, q in 0..15 (Q4_1, and Q4_0 with offset -8 * scale: an eighth). So a GGUF file's
blocks load as they are (`WeightOnly.from_gguf`, `attach_blocks`), and a float checkpoint quantizes into the
same forms. Activations stay float: the native kernels (native.py's `WEIGHT_ONLY`, AVX2) widen each group to
float32 and multiply it into every row of the batch; with bf16/fp16 activations int4 runs in torch's own
kernel (`aten._weight_int4pack_mm_for_cpu`, fast where the CPU computes bf16 natively). Where neither
applies the linear computes with its dequantized weight (correct, not faster), and says so once.

Many rows at once (a prefill, a large batch) are bound by arithmetic, not bytes, and there a dense GEMM beats
every weight-only kernel: with `dense_rows` (engine argument `quantized_dense_rows`) a linear also keeps
oneDNN's packed copy of its dequantized weight and computes inputs of that many rows or more with it (the demo
SmolLM2 at 32 sequences in bf16: 68 -> 43 ms a step). A sequence's rounding then depends on its step's rows.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.stages.ar.cpu import native

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("auto", "none", "int8", "int4")
GROUP = 32  # input columns sharing a scale (GGUF's block)
BLOCKS_FILE = "weight_only.safetensors"  # a checkpoint's quantized blocks (a GGUF's, written at conversion)


@dataclasses.dataclass
class WeightOnly:
    """A linear's quantized weight `[N, K]`, kernel-independent (so several can be joined along N first).
    int8: `q` int8 [N, K], `scale` [N, K / GROUP]. int4: `q` uint8 in 0..15 [N, K], `scale` and `offset`
    [N, K / GROUP]. Scales in float32."""

    kind: str
    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None = None

    @staticmethod
    def int8(weight: torch.Tensor) -> WeightOnly:
        """Symmetric per group: each group's largest magnitude maps to 127 (how llama.cpp makes Q8_0, so a
        Q8_0 weight's float values quantize back to its own blocks)."""
        g = _groups(weight)
        scale = g.abs().amax(dim=2) / 127.0
        q = torch.round(g / torch.where(scale == 0, 1.0, scale)[..., None]).clamp(-127, 127)
        return WeightOnly("int8", q.view(weight.shape).to(torch.int8), scale)

    @staticmethod
    def int4(weight: torch.Tensor) -> WeightOnly:
        """Asymmetric per group: each group's min and max map onto 0 and 15 (llama.cpp's Q4_1)."""
        g = _groups(weight)
        low, high = g.amin(dim=2), g.amax(dim=2)
        scale = (high - low) / 15.0
        q = torch.round((g - low[..., None]) / torch.where(scale == 0, 1.0, scale)[..., None]).clamp(0, 15)
        return WeightOnly("int4", q.view(weight.shape).to(torch.uint8), scale, low)

    @staticmethod
    def of(weight: torch.Tensor, kind: str) -> WeightOnly:
        if kind == "int8":
            return WeightOnly.int8(weight)
        if kind == "int4":
            return WeightOnly.int4(weight)
        raise ValueError(f"quantization must be int8 or int4 to quantize a weight; got {kind!r}")

    @staticmethod
    def cat(parts: list[WeightOnly]) -> WeightOnly:
        """Several weights reading the same input as one (rows one after another)."""
        first = parts[0]
        if any(p.kind != first.kind for p in parts):
            raise ValueError("only weights quantized the same way can be joined")
        offset = None if first.offset is None else torch.cat([p.offset for p in parts])
        return WeightOnly(
            first.kind, torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]), offset
        )

    def dequantized(self) -> torch.Tensor:
        """The float32 weight this stands for (what the kernels compute with)."""
        n, k = self.q.shape
        w = self.q.float().view(n, k // GROUP, GROUP) * self.scale[..., None]
        if self.offset is not None:
            w = w + self.offset[..., None]
        return w.view(n, k)

    @property
    def nbytes(self) -> int:
        bits = 8 if self.kind == "int8" else 4
        scales = 2 if self.offset is not None else 1
        return self.q.numel() * bits // 8 + scales * self.scale.numel() * 4


def _groups(weight: torch.Tensor) -> torch.Tensor:
    w = weight.detach().float()
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"weight-only quantization needs an input width divisible by {GROUP}; got {k}")
    return w.view(n, k // GROUP, GROUP)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 0..15 [N, K] → [N, K / 2] in GGUF's order: byte j of a group holds q[j] (low) and q[j + 16]."""
    n, k = q.shape
    halves = q.view(n, k // GROUP, 2, GROUP // 2)
    return (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


class QuantizedLinear:
    """`x [..., K]` → `x @ W.T + b` through a weight-only kernel (the module docstring says which); with
    `dense_rows`, inputs of that many rows or more through a dense packed copy of the dequantized weight."""

    def __init__(
        self, weight: WeightOnly, bias: torch.Tensor | None, dtype: torch.dtype, dense_rows: int = 0
    ):
        self.kind, self.dtype, self.bias = weight.kind, dtype, bias
        self.out_features = int(weight.q.shape[0])
        self.path = kernel_path(weight.kind, dtype)
        self.dense_rows = dense_rows
        self.dense = dense_copy(weight, bias, dtype) if dense_rows > 0 else None
        if self.path == "native":
            kernels = native.weight_only_kernels()
            self.scale = weight.scale.float().contiguous()
            if weight.kind == "int4":
                self.q, self.offset = pack_nibbles(weight.q), weight.offset.float().contiguous()
                self.run = functools.partial(_int4, kernels.int4_linear, self.q, self.scale, self.offset)
            else:
                self.q = weight.q.contiguous()
                self.run = functools.partial(_int8, kernels.int8_linear, self.q, self.scale)
        elif self.path == "torch-int4":
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(weight.q.to(torch.int32), 1)
            zero = weight.offset + 8.0 * weight.scale  # torch's form: (q - 8) * scale + zero
            self.scales_and_zeros = torch.stack([weight.scale.t(), zero.t()], dim=-1).to(dtype).contiguous()
            self.run = self._torch_int4
        else:
            self.weight = weight.dequantized().to(dtype)
            self.run = self._dequantized

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """A lone sequence's step makes some two hundred of these calls: the Python here is kept short."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        if self.dense is not None and flat.shape[0] >= self.dense_rows:
            out = self.dense(flat.to(self.dtype))
            return out.view(*shape[:-1], self.out_features).to(x.dtype)
        out = self.run(flat)
        if self.bias is not None:
            out = out + self.bias
        return out.view(*shape[:-1], self.out_features).to(x.dtype)

    def _torch_int4(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat.to(self.dtype), self.packed, GROUP, self.scales_and_zeros
        )

    def _dequantized(self, flat: torch.Tensor) -> torch.Tensor:
        return F.linear(flat.to(self.dtype), self.weight)


def _int4(kernel, q, scale, offset, flat: torch.Tensor) -> torch.Tensor:
    return kernel(flat.float().contiguous(), q, scale, offset)


def _int8(kernel, q, scale, flat: torch.Tensor) -> torch.Tensor:
    return kernel(flat.float().contiguous(), q, scale)


def dense_copy(
    weight: WeightOnly, bias: torch.Tensor | None, dtype: torch.dtype
) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """`x → x @ W.T + b` on oneDNN's packed copy of the dequantized weight in `dtype` (packed_linear.py's);
    None where packed_linear packs no `dtype` weights (an emulated bf16 GEMM is slower than the weight-only
    kernels)."""
    from omnistage.stages.ar.cpu import packed_linear  # it builds on this module: imported when used

    if not packed_linear.packing_available() or dtype not in packed_linear.packable_dtypes():
        return None
    packed = packed_linear.onednn_copy(weight.dequantized().to(dtype))
    return functools.partial(packed_linear.onednn_linear, packed, bias)


def kernel_path(kind: str, dtype: torch.dtype) -> str:
    """Which kernel computes `kind` weights with `dtype` activations: "torch-int4" (int4, bf16/fp16),
    "native" (the rest, where the native kernels are built), else "dequantized"."""
    kernels = native.weight_only_kernels() is not None
    if kind == "int4" and dtype in (torch.bfloat16, torch.float16):
        return "torch-int4"
    if kernels:
        return "native"
    _warn_dequantized(kind)
    return "dequantized"


@functools.cache
def _warn_dequantized(kind: str) -> None:
    logger.warning(
        "%s weights compute with dequantized float weights here (no native weight-only kernels: they need "
        "an AVX2 CPU and `make setup`); answers are the same, not faster",
        kind,
    )


def quantize_linears(
    model: nn.Module,
    kind: str,
    dtype: torch.dtype,
    skip: tuple[nn.Module, ...] = (),
    root: nn.Module | None = None,
    dense_rows: int = 0,
) -> int:
    """Route every `nn.Linear` under `model` (but those in `skip`) through a weight-only quantized copy of
    its weight; returns how many. A linear that carries `weight_only` (`attach_blocks`: its file's own
    blocks) keeps those; any other is quantized to `kind` ("auto": only those with blocks). The float
    weight is freed unless another module under `root` (default: `model`) shares it (a head tied to the
    embeddings)."""
    if kind not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}; got {kind!r}")
    if kind == "none":
        return 0
    skipped = {id(m) for m in skip}
    shared = _shared_weights(root or model)
    count = 0
    for module in model.modules():
        if type(module) is not nn.Linear or id(module) in skipped or module.weight.device.type != "cpu":
            continue
        weight = getattr(module, "weight_only", None)
        if weight is None:
            if kind == "auto" or module.in_features % GROUP:
                continue  # the groups must tile the input
            weight = WeightOnly.of(module.weight, kind)
        bias = None if module.bias is None else module.bias.detach().to(dtype)
        module.weight_only = weight
        module.forward = QuantizedLinear(weight, bias, dtype, dense_rows)
        if id(module.weight) not in shared:
            module.weight = nn.Parameter(torch.empty(0, dtype=module.weight.dtype), requires_grad=False)
        count += 1
    if count:
        logger.info("%d linear layers on weight-only weights (%s)", count, kind)
    return count


def _shared_weights(model: nn.Module) -> set[int]:
    """Parameters more than one module holds (a tied head's weight is the embedding table)."""
    seen: dict[int, int] = {}
    for module in model.modules():
        for param in module.parameters(recurse=False):
            seen[id(param)] = seen.get(id(param), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def attach_blocks(model: nn.Module, model_dir: str | None, kind: str = "auto") -> int:
    """Give each linear whose weight `BLOCKS_FILE` in `model_dir` holds (by parameter name: `NAME.q`,
    `NAME.scale`, `NAME.offset`) those blocks as its `weight_only` (of `kind` only, unless "auto"); returns
    how many."""
    path = Path(model_dir or "") / BLOCKS_FILE
    if not model_dir or not path.is_file():
        return 0
    from safetensors.torch import load_file

    blocks = load_file(str(path))
    count = 0
    for name, module in model.named_modules():
        key = f"{name}.weight"
        if type(module) is not nn.Linear or f"{key}.q" not in blocks:
            continue
        q, offset = blocks[f"{key}.q"], blocks.get(f"{key}.offset")
        held = "int8" if q.dtype == torch.int8 else "int4"
        if kind not in ("auto", held):
            continue
        if tuple(q.shape) != tuple(module.weight.shape):
            raise ValueError(
                f"{path}: {key} blocks are {tuple(q.shape)}, the weight {tuple(module.weight.shape)}"
            )
        module.weight_only = WeightOnly(held, q, blocks[f"{key}.scale"], offset)
        count += 1
    return count


def weight_only_summary(model: nn.Module) -> dict[str, int]:
    """How many linears under `model` compute on weight-only weights, by kind and kernel path."""
    counts: dict[str, int] = {}
    for module in model.modules():
        if is_quantized(module):
            linear = module.forward
            dense = "" if linear.dense is None else f"; dense from {linear.dense_rows} rows"
            key = f"{linear.kind} ({linear.path}{dense})"
            counts[key] = counts.get(key, 0) + 1
    return counts


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
        joint = WeightOnly.cat([m.weight_only for m in linears])
        self.linear = QuantizedLinear(joint, bias, first.dtype, first.dense_rows)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.whole(x).split(self.widths, dim=-1)

    def whole(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)
