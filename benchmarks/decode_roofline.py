"""How near the AR engine's decode steps run to this machine's bounds (issue 63): memory and arithmetic.

A decode step reads every linear's weights once (the bytes the quantized blocks or float weights hold) and
does 2 x weights x sequences flops with them. The benchmark measures, on the spot, the bandwidth of a pure
read (a sum over 1 GiB) and the GEMM rate of each compute dtype (a 2048^3 matmul through oneDNN), then times
decode steps of the demo's chat model (SmolLM2-135M, its Q4_1 GGUF) at 1, 8 and 32 sequences with the
deployment's defaults (the file's blocks, dense copies from 16 rows, bf16 where the CPU computes it
natively), the same without dense copies, float32 with and without them, and float32 float weights, and
prints each step (and the prefill before it) against both bounds: memory fraction = (weight bytes /
bandwidth) / step time, compute fraction = (flops / GEMM rate in the step's dtype) / step time.

    OMP_NUM_THREADS=2 PYTHONPATH=$PWD .venv/bin/python benchmarks/decode_roofline.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quantized_quality import smollm_engine  # noqa: E402

from omnistage.families import registry  # noqa: E402
from omnistage.params import SamplingParams  # noqa: E402
from omnistage.stages.base import StageRequest  # noqa: E402

# (label, dtype, quantization, quantized_dense_rows): the deployment's defaults (llm.yaml: "auto", the
# file's blocks, dense copies from 16 rows; bf16 where the CPU has it natively), the same without dense
# copies, float32 with and without them, and float32 float weights.
CONTESTANTS = [("default", "auto", "auto", 16), ("auto blocks", "auto", "auto", 0),
               ("float32 dense", "float32", "auto", 16), ("float32 auto", "float32", "auto", 0),
               ("float32 none", "float32", "none", 0)]  # fmt: skip


def best_of(runs: int, fn) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def read_bandwidth() -> float:
    """Bytes per second of a pure read of 1 GiB (torch's sum: one pass, nothing written)."""
    data = torch.ones(1 << 28)
    return data.numel() * 4 / best_of(5, lambda: data.sum())


def gemm_rate(dtype: torch.dtype) -> float:
    a, b = torch.randn(2048, 2048).to(dtype), torch.randn(2048, 2048).to(dtype)
    return 2 * 2048**3 / best_of(3, lambda: a @ b)


def weight_bytes_and_params(root: nn.Module, dense: int, size: int) -> tuple[int, int]:
    """What a decode step reads of the linears (the blocks and scales, or the float weights: a quantized
    linear's dense copy, of `size` bytes a weight, where the step has `dense` rows) and their weight count
    (for the flops)."""
    total = params = 0
    for module in root.modules():
        if type(module) is not nn.Linear:
            continue
        blocks = getattr(module, "weight_only", None)  # quantized (alone or inside a joint q/k/v, gate/up)
        if blocks is not None:
            total += blocks.q.numel() * size if dense else blocks.nbytes
            params += blocks.q.numel()
        else:
            total += module.weight.nbytes
            params += module.weight.numel()
    return total, params


def step_time(dtype: str, quantization: str, seqs: int, steps: int, dense_rows: int = 0):
    """The median decode step of `seqs` sequences (after their prefill), and the step's bytes and params."""
    eng = smollm_engine(dtype, quantization, dense_rows)
    for i in range(seqs):
        params = SamplingParams(max_tokens=4 * steps + 8, temperature=0.0, ignore_eos=True)
        eng.add_request(StageRequest(f"r{i}", prompt=list(range(100 + i, 160 + i)), params=params))
    start = time.perf_counter()
    eng.step()  # the prefill
    prefill = time.perf_counter() - start
    for _ in range(2):  # two warm decode steps
        eng.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - start)
    dense = 0 < dense_rows <= seqs
    nbytes, count = weight_bytes_and_params(eng.model.root or eng.model.decoder, dense, eng.dtype.itemsize)
    eng.shutdown()
    return sorted(times)[len(times) // 2], prefill, nbytes, count, eng.dtype


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    registry.load()
    print(f"threads {torch.get_num_threads()}; load average {os.getloadavg()}", flush=True)
    bandwidth, rates = read_bandwidth(), {}
    print(f"measured: read bandwidth {bandwidth / 1e9:.1f} GB/s", flush=True)
    for label, dtype, quantization, dense_rows in CONTESTANTS:
        for seqs in (1, 8, 32):
            step, prefill, nbytes, params, computed = step_time(
                dtype, quantization, seqs, args.steps, dense_rows
            )
            if computed not in rates:
                rates[computed] = gemm_rate(computed)
                print(f"measured: {computed} GEMM {rates[computed] / 1e9:.1f} GFLOP/s", flush=True)
            rate = rates[computed]
            memory = nbytes / bandwidth / step
            compute = 2 * params * seqs / rate / step
            print(
                f"{label:<13} {str(computed)[6:]:<8} {seqs:2d} seqs: step {step * 1e3:6.1f} ms  "
                f"{seqs / step:6.1f} tok/s  weights {nbytes / 1e6:6.1f} MB  memory bound "
                f"{nbytes / bandwidth * 1e3:5.1f} ms ({memory:5.1%})  compute bound "
                f"{2 * params * seqs / rate * 1e3:6.1f} ms ({compute:5.1%})  prefill of {seqs} x 60 tokens "
                f"{prefill * 1e3:7.1f} ms  load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
