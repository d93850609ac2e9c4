"""`omnistage bench serve`: load on a running OpenAI-compatible server (omnistage's or any other) and the
figures the field reports (vLLM-Omni's `vllm bench serve --omni` definitions, see `metrics.py`).

Requests arrive at `--request-rate` (Poisson; `inf`: all at once) with at most `--max-concurrency` in
flight. A failed request is counted, never fatal. Ctrl-C stops the run and reports what was measured so far.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import logging
import math
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from omnistage.bench.backends import BACKENDS, sender
from omnistage.bench.datasets import DATASETS, BenchRequest, load_dataset, speak_prompts
from omnistage.bench.metrics import RequestOutput, parse_slos, percentile, summarize
from omnistage.bench.stages import StageMonitor

__all__ = ["add_args", "main", "percentile", "run_requests", "format_summary"]


@dataclasses.dataclass
class RunResult:
    outputs: list[RequestOutput]
    duration_s: float
    interrupted: bool


async def run_requests(
    send: Callable[[BenchRequest], Awaitable[RequestOutput]],
    requests: list[BenchRequest],
    *,
    max_concurrency: int | None = None,
    request_rate: float = math.inf,
    seed: int = 0,
    stop: asyncio.Event | None = None,
    progress: bool = False,
) -> RunResult:
    """Sends `requests`; when `stop` is set, the requests still running are cancelled and left out."""
    from tqdm import tqdm

    stop = stop or asyncio.Event()
    limit = asyncio.Semaphore(max_concurrency or len(requests) or 1)
    outputs: list[RequestOutput | None] = [None] * len(requests)
    tasks: list[asyncio.Task] = []
    bar = tqdm(total=len(requests), disable=not progress, file=sys.stderr, unit="req")
    last_done = time.perf_counter()

    async def one(i: int, request: BenchRequest) -> None:
        nonlocal last_done
        async with limit:
            outputs[i] = await send(request)
        last_done = time.perf_counter()
        bar.update()

    async def dispatch() -> None:
        gaps = random.Random(seed)
        for i, request in enumerate(requests):
            tasks.append(asyncio.create_task(one(i, request)))
            if math.isfinite(request_rate) and i + 1 < len(requests):
                await asyncio.sleep(gaps.expovariate(request_rate))
        await asyncio.gather(*tasks)

    start = time.perf_counter()
    runner, stopper = asyncio.create_task(dispatch()), asyncio.create_task(stop.wait())
    await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
    interrupted = not runner.done()
    for task in (runner, stopper, *tasks):
        task.cancel()
    await asyncio.gather(runner, stopper, *tasks, return_exceptions=True)
    bar.close()
    end = time.perf_counter() if interrupted else last_done
    return RunResult([o for o in outputs if o is not None], end - start, interrupted)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (no /v1)")
    parser.add_argument("--backend", required=True, choices=BACKENDS)
    parser.add_argument("--model", help="served model name (default: the server's first model)")
    parser.add_argument("--dataset", default="random", choices=DATASETS)
    parser.add_argument("--dataset-path", help="the local file of sharegpt-file / tts-file")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-concurrency", type=int, default=None, help="default: no limit")
    parser.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson (inf)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--random-input-len", type=int, default=32, help="prompt words")
    parser.add_argument("--random-output-len", type=int, default=None, help="max tokens (random: 32)")
    parser.add_argument("--random-range-ratio", type=float, default=0.0)
    parser.add_argument("--random-mm-num-images", type=int, default=1)
    parser.add_argument("--random-mm-image-size", default="64x64", help="WIDTHxHEIGHT")
    parser.add_argument(
        "--speak-prompts-with",
        metavar="VOICE",
        help="realtime: the server's VOICE says each prompt first (/v1/audio/speech); the turns are spoken",
    )
    parser.add_argument(
        "--extra-body", help="JSON object merged into every request body (realtime: into the session)"
    )
    parser.add_argument("--goodput", help="SLOs, e.g. 'ttft:500 tpot:50 e2el:2000' (ms; rtf unitless)")
    parser.add_argument("--metric-percentiles", default="50,90,99", help="comma-separated")
    parser.add_argument("--num-warmups", type=int, default=0, help="requests sent first, not measured")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--result-file", help="write the figures as JSON")
    parser.add_argument("--disable-tqdm", action="store_true")


def main(args: argparse.Namespace) -> int:
    """Runs the benchmark; 130 when interrupted (after reporting), 0 otherwise, failed requests included."""
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request would bury the table
    try:
        result = asyncio.run(bench(args))
    except (ValueError, httpx.HTTPError) as exc:  # bad flags, or no server to ask for its models
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.result_file:  # first: a closed stdout (`| head`) must not lose the figures
        Path(args.result_file).write_text(json.dumps(result, indent=2))
    print(format_summary(result), flush=True)
    return 130 if result["interrupted"] else 0


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    width, _, height = args.random_mm_image_size.partition("x")
    requests = load_dataset(
        args.dataset,
        args.num_prompts + args.num_warmups,
        seed=args.seed,
        path=args.dataset_path,
        input_len=args.random_input_len,
        output_len=args.random_output_len,
        range_ratio=args.random_range_ratio,
        mm_images=args.random_mm_num_images,
        mm_size=(int(width), int(height or width)),
    )
    spoken = args.dataset == "audio-file" or args.speak_prompts_with
    if spoken and args.backend != "realtime":
        raise ValueError(f"--backend {args.backend} sends text: spoken turns go to --backend realtime")
    extra = json.loads(args.extra_body) if args.extra_body else {}
    slos = parse_slos(args.goodput)
    percentiles = tuple(float(q) for q in args.metric_percentiles.split(",") if q.strip())
    send_one = sender(args.backend)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=args.base_url, timeout=args.timeout, limits=limits) as client:
        model = args.model or (await client.get("/v1/models")).json()["data"][0]["id"]
        if args.speak_prompts_with:
            await speak_prompts(client, args.speak_prompts_with, requests, args.seed)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            warmups, measured = requests[: args.num_warmups], requests[args.num_warmups :]
            if warmups:
                await run_requests(lambda r: send_one(client, model, r, extra), warmups, stop=stop)
            monitor = StageMonitor(client, model)
            await monitor.start()
            run = await run_requests(
                lambda r: send_one(client, model, r, extra),
                [] if stop.is_set() else measured,
                max_concurrency=args.max_concurrency,
                request_rate=args.request_rate,
                seed=args.seed,
                stop=stop,
                progress=not args.disable_tqdm,
            )
            await monitor.stop()
        finally:
            loop.remove_signal_handler(signal.SIGINT)
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "base_url": args.base_url,
        "backend": args.backend,
        "model": model,
        "dataset": args.dataset,
        "num_prompts": args.num_prompts,
        "max_concurrency": args.max_concurrency,
        "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
        "seed": args.seed,
        "extra_body": extra,
        "interrupted": run.interrupted or stop.is_set(),
        **summarize(run.outputs, run.duration_s, percentiles, slos),
        "stage_breakdown": monitor.breakdown(),
        "errors": [o.error for o in run.outputs if not o.success][:20],
        "requests": [_request_record(o) for o in run.outputs],
    }


def _request_record(out: RequestOutput) -> dict[str, Any]:
    record = dataclasses.asdict(out)
    for key in ("audio_chunks", "itl_s", "text", "last_text_s"):
        record.pop(key)
    return record | {
        "tpot_s": out.tpot_s,
        "audio_duration_s": out.audio_duration_s,
        "audio_rtf": out.audio_rtf,
        "audio_underrun_s": out.audio_underrun_s,
    }


def format_summary(result: dict[str, Any]) -> str:
    """The end-of-run table: counts and throughputs, then each metric's mean/median/percentiles."""
    title = " Serving Benchmark Result " + ("(interrupted) " if result["interrupted"] else "")
    lines = [f"{title:=^60}"]

    def row(label: str, value: Any) -> None:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{label:<44}{text:>16}")

    row("Backend:", result["backend"])
    row("Model:", result["model"])
    row(
        "Requests sent/successful/failed:",
        f"{result['num_requests']}/{result['completed']}/{result['failed']}",
    )
    row("Maximum request concurrency:", result["max_concurrency"] or "unlimited")
    row("Benchmark duration (s):", result["duration_s"])
    row("Request throughput (req/s):", result["request_throughput"])
    if result["total_output_tokens"]:
        row("Total input tokens:", result["total_input_tokens"])
        row("Total generated tokens:", result["total_output_tokens"])
        row("Output token throughput (tok/s):", result["output_throughput"])
        row("Total token throughput (tok/s):", result["total_token_throughput"])
    if result["slos"]:
        row("Request goodput (req/s):", result["goodput"])
        row("SLO attainment:", result["slo_attainment"])
    if "total_audio_duration_s" in result:
        row("Total audio duration (s):", result["total_audio_duration_s"])
        row("Audio throughput (audio-s/s):", result["audio_throughput"])
        row(
            f"Continuity OK rate (underrun<{result['audio_continuity_threshold_s']} s):",
            result["audio_continuity_ok_rate"],
        )
    if "total_images" in result:
        row("Total images / videos:", f"{result['total_images']}/{result['total_videos']}")
        row("Image throughput (images/s):", result["image_throughput"])
        row("Video throughput (videos/s):", result["video_throughput"])
    for metric in [key[len("mean_") :] for key in result if key.startswith("mean_")]:
        lines.append(f"{' ' + metric + ' ':-^60}")
        for stat in ("mean", "median", *(f"p{q:g}" for q in result["percentiles"])):
            row(f"{stat.capitalize()} {metric}:", result[f"{stat}_{metric}"])
    breakdown = result.get("stage_breakdown")
    if breakdown:
        lines.append(f"{' per stage (server /metrics) ':-^60}")
        lines.append(f"{'stage':<18}{'requests':>10}{'peak held':>11}{'peak queue':>11}{'peak kv':>10}")
        for s in breakdown["stages"]:
            lines.append(
                f"{str(s['stage']) + ' ' + s['stage_name']:<18}{s['requests']:>10.0f}"
                f"{s['peak_requests']:>11.0f}{s['peak_queue_depth']:>11.0f}{s['peak_kv_cache_usage']:>10.2f}"
            )
        for key in ("server_mean_ttft_ms", "server_mean_ttfa_ms"):
            if breakdown.get(key) is not None:
                row(f"Server-side {key[7:]}:", breakdown[key])
    if result["errors"]:
        lines.append(f"first error: {result['errors'][0]}")
    lines.append("=" * 60)
    return "\n".join(lines)


def cli(argv: list[str] | None = None) -> int:
    """`python -m omnistage.bench.serve ...` (the same as `omnistage bench serve ...`)."""
    parser = argparse.ArgumentParser(prog="omnistage bench serve", description=__doc__.split("\n\n")[0])
    add_args(parser)
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
