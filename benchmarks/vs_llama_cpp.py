"""Chat on one GGUF file: omnistage against llama.cpp's OpenAI-compatible server (issue 63).

Both servers serve the same GGUF (the demo's SmolLM2-135M-Instruct Q4_1 by default) and get the same
workload from the same client (`omnistage bench serve --backend chat`, random ~62-token prompts): exactly
`--output-len` tokens a request on both sides (omnistage: `ignore_eos`; llama.cpp: `min_tokens`, which the
table checks from the tokens counted). Contestants alternate within each round, each server started fresh
and stopped after its run, and the load average is printed with every figure.

llama.cpp is `llama-cpp-python[server]` (PyPI builds llama.cpp from source; it is not an omnistage
dependency): give its interpreter with `--llama-python` (e.g. a venv made with
`python -m venv /work/llama_venv && /work/llama_venv/bin/pip install 'llama-cpp-python[server]==0.3.36'`).

    python benchmarks/vs_llama_cpp.py --llama-python /work/llama_venv/bin/python
    Q='{"0": {"engine_args": {"quantization": "int4"}}}'
    python benchmarks/vs_llama_cpp.py --llama-python ... --omnistage "bf16=--dtype bfloat16" \\
        --omnistage "bf16-int4=--dtype bfloat16 --stage-overrides '$Q'"

(`--omnistage LABEL=FLAGS`, repeatable: each is a contestant, its FLAGS passed to `omnistage serve` as a
shell would split them; without one, the demo's own settings.)
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from local_server import start_server, stop, wait_ready  # noqa: E402

from omnistage.demo.smollm import smollm2_gguf  # noqa: E402

WORKLOADS = {1: 8, 8: 32, 32: 64}  # concurrency → prompts


def start_llama_cpp(python: str, gguf: Path, port: int, threads: int, name: str) -> subprocess.Popen:
    command = [
        python, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", name, "--port", str(port),
        "--n_threads", str(threads), "--n_ctx", "2048", "--verbose", "False",
        "--interrupt_requests", "False",  # its default: a new request cuts the one in flight short
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return wait_ready(proc, f"http://127.0.0.1:{port}/v1/models", 300)


def bench(port: int, name: str, concurrency: int, output_len: int, extra: dict | None) -> dict:
    """One `omnistage bench serve` run; its result JSON."""
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        command = [
            sys.executable, "-m", "omnistage", "bench", "serve", "--base-url", f"http://127.0.0.1:{port}",
            "--backend", "chat", "--model", name, "--dataset", "random",
            "--num-prompts", str(WORKLOADS[concurrency]), "--max-concurrency", str(concurrency),
            "--random-input-len", "48", "--random-output-len", str(output_len), "--seed", "0",
            "--num-warmups", "2", "--result-file", result.name, "--disable-tqdm",
        ]  # fmt: skip
        if extra:
            command += ["--extra-body", json.dumps(extra)]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
        return json.loads(Path(result.name).read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-python", required=True, help="the interpreter with llama-cpp-python[server]")
    parser.add_argument("--gguf", default=None, help="default: the demo's SmolLM2 Q4_1 file")
    parser.add_argument(
        "--omnistage",
        action="append",
        default=None,
        help="a contestant 'LABEL=SERVE FLAGS' (repeatable); default: the demo's own settings",
    )
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8731)
    args = parser.parse_args()
    gguf = Path(args.gguf) if args.gguf else smollm2_gguf()
    name = "smollm2-135m-instruct" if args.gguf is None else gguf.stem.lower()
    levels = [int(c) for c in args.concurrency.split(",")]
    contestants = {"llama.cpp": None}
    for spec in args.omnistage or ["omnistage="]:
        label, _, flags = spec.partition("=")
        contestants[label] = shlex.split(flags)
    print(f"GGUF {gguf}; {args.output_len} output tokens; load average {os.getloadavg()}", flush=True)
    figures: dict[tuple[int, str, int], dict] = {}
    for rnd in range(1, args.rounds + 1):
        for label, flags in contestants.items():
            if flags is None:
                proc = start_llama_cpp(args.llama_python, gguf, args.port, args.threads, name)
                extra = {"min_tokens": args.output_len}
            else:
                proc = start_server(str(gguf), args.port, ["--served-model-name", name, *flags])
                extra = None
            try:
                for c in levels:
                    result = bench(args.port, name, c, args.output_len, extra)
                    figures[(rnd, label, c)] = result
                    exact = result["total_output_tokens"] == args.output_len * WORKLOADS[c]
                    print(
                        f"round {rnd} {label:<14} c={c:<3} output {result['output_throughput']:7.1f} tok/s  "
                        f"TTFT p50 {result['median_ttft_ms']:8.1f} ms  "
                        f"TPOT p50 {result['median_tpot_ms']:6.1f} ms  "
                        f"tokens {'exact' if exact else result['total_output_tokens']}  "
                        f"failed {result['failed']}  load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
            finally:
                stop(proc)
    print("\nratios against llama.cpp (same round):")
    for rnd in range(1, args.rounds + 1):
        for label in list(contestants)[1:]:
            for c in levels:
                ours, theirs = figures[(rnd, label, c)], figures[(rnd, "llama.cpp", c)]
                tps = ours["output_throughput"] / theirs["output_throughput"]
                ttft = ours["median_ttft_ms"] / theirs["median_ttft_ms"]
                print(f"  round {rnd} {label:<14} c={c:<3} output tok/s {tps:5.2f}x  TTFT p50 {ttft:5.2f}x")
    print(f"load average at the end {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
