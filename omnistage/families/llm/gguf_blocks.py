"""A GGUF file's quantized blocks, kept beside its converted checkpoint (quantized_linear.BLOCKS_FILE).

The converted safetensors hold the weights as floats (what transformers and every other engine path read);
the AR engine's weight-only linears read the file's own Q4_0 / Q4_1 / Q8_0 blocks instead, so a GGUF serves
with the bytes it holds and the values it stands for (the float weights are these blocks dequantized). Each
block tensor is matched to the model's linear whose float weight it dequantizes to, row for row: llama.cpp
reorders the rows of some weights (the Q/K rotary permutation), and the match finds that order without
knowing any architecture's rules. Other block types (K-quants, ...) are left to the float weights.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import torch
from torch import nn

from omnistage.stages.ar.cpu.quantized_linear import BLOCKS_FILE, GROUP, WeightOnly

logger = logging.getLogger(__name__)

LAYER = re.compile(r"^blk\.(\d+)\.")


def read_blocks(kind_name: str, data: np.ndarray) -> WeightOnly | None:
    """A GGUF tensor's blocks (`data`: uint8 [N, bytes per row]) as a WeightOnly; None for other types."""
    rows = data.shape[0]
    if kind_name == "Q8_0":  # per block: d (f16), 32 × int8
        blocks = data.reshape(rows, -1, 34)
        scale = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
        q = blocks[..., 2:].copy().view(np.int8).reshape(rows, -1)
        return WeightOnly("int8", torch.from_numpy(q), torch.from_numpy(scale))
    if kind_name not in ("Q4_0", "Q4_1"):
        return None
    width = 18 if kind_name == "Q4_0" else 20  # d (f16)[, m (f16)], 16 bytes of nibbles
    blocks = data.reshape(rows, -1, width)
    scale = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind_name == "Q4_0":
        offset = -8.0 * scale  # q * d - 8d
    else:
        offset = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    nibbles = blocks[..., width - 16 :]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).reshape(rows, -1)  # q[j], then q[j + 16]
    return WeightOnly("int4", torch.from_numpy(q), torch.from_numpy(scale), torch.from_numpy(offset))


def row_order(weight: torch.Tensor, blocks: WeightOnly) -> torch.Tensor | None:
    """The block rows in the weight's row order (`index`: weight row i is block row index[i]), or None when
    the blocks do not dequantize to this weight."""
    if tuple(blocks.q.shape) != tuple(weight.shape):
        return None
    values, weight = blocks.dequantized(), weight.detach().float()
    probe = torch.randn(weight.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mine, theirs = weight.double() @ probe, values.double() @ probe
    index = torch.argsort(theirs)[torch.argsort(torch.argsort(mine))]
    tolerance = 1e-5 * max(float(weight.abs().max()), 1e-12)  # Q4_0's d * (q - 8) against q * d - 8d
    return index if torch.allclose(values[index], weight, rtol=0, atol=tolerance) else None


def write_blocks(gguf_path: Path, model: nn.Module, out: Path) -> int:
    """Write `out / BLOCKS_FILE` with the blocks of every linear of `model` (loaded from `gguf_path`) whose
    weight the file holds in a block form the engine reads; returns how many (none: no file)."""
    import gguf
    from safetensors.torch import save_file

    linears = {name: m for name, m in model.named_modules() if type(m) is nn.Linear}
    tensors: dict[str, torch.Tensor] = {}
    taken: set[str] = set()
    for tensor in gguf.GGUFReader(str(gguf_path)).tensors:
        blocks = read_blocks(tensor.tensor_type.name, np.asarray(tensor.data))
        if blocks is None or blocks.q.shape[1] % GROUP:
            continue
        layer = LAYER.match(tensor.name)
        for name, module in linears.items():
            in_layer = f"layers.{layer.group(1)}." in name if layer else ".layers." not in f".{name}"
            if name in taken or not in_layer:
                continue
            index = row_order(module.weight, blocks)
            if index is None:
                continue
            taken.add(name)
            key = f"{name}.weight"
            tensors[f"{key}.q"] = blocks.q[index].contiguous()
            tensors[f"{key}.scale"] = blocks.scale[index].contiguous()
            if blocks.offset is not None:
                tensors[f"{key}.offset"] = blocks.offset[index].contiguous()
            break
    if tensors:
        save_file(tensors, str(out / BLOCKS_FILE))
    logger.info("%s: kept the blocks of %d of %d linears", gguf_path.name, len(taken), len(linears))
    return len(taken)
