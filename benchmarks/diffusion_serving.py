"""Diffusion serving benchmark: omnistage's diffusion engine against plain diffusers pipeline calls.

Every figure is measured in one run, on one model, with the same seeds:

  1. overhead at concurrency 1 — one request at a time: plain `pipe(...)` vs request mode vs step mode;
  2. Poisson workload — N requests (33 frames, 128x128, 20 steps) arriving as a Poisson process: throughput
     and p50/p99 latency for sequential plain calls (first come, first served), request mode, step mode, and
     step mode + cache-dit (PSNR of each cached output against the uncached one). All modes run in
     interleaved rounds (`--rounds`), each compared with plain from its own round; the median is reported;
  3. short-request latency — one 81-frame and seven 9-frame requests: p50 latency of the 9-frame requests,
     step mode (shortest-remaining-work-first) vs first-come-first-served whole-request execution.

The model is a random-weight Wan checkpoint sized by --dim/--heads/--layers/--ffn, or any Wan pipeline
directory (--model; e.g. the trained demo model, with --demo-captions for prompts it knows). cache-dit:
a random model's residuals never fall under a threshold, so by default section 2 caches on a fixed schedule
(`--cache-options fixed`); on a trained model pass DBCache options (JSON) and the model's own residuals
decide which steps are reused, e.g. `--cache-options '{"max_continuous_cached_steps": 2}'`; a JSON list of
option sets runs one cached mode per set, interleaved with the others.

The engine is driven in-process, the way the stage worker drives it: requests are added when their arrival
time has passed, and `step()` runs while there is work. Latency = finish time - arrival time.

    python benchmarks/diffusion_serving.py              # full run (several minutes on 2 cores)
    python benchmarks/diffusion_serving.py --quick      # smaller workload, to check the script

On a loaded machine pass `--threads 1`: two OpenMP threads on two oversubscribed cores wait on each other at
every barrier (measured at load 8: 5.5 s per step with 2 threads, 0.77 s with 1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import diffusion_families  # noqa: E402

from omnistage import media  # noqa: E402
from omnistage.config.deploy import StageDeploy  # noqa: E402
from omnistage.families import registry  # noqa: E402
from omnistage.families.diffusers.tiny import wan_bench_dir  # noqa: E402
from omnistage.stages.diffusion.engine import DiffusionEngine  # noqa: E402

PROMPTS = diffusion_families.PROMPTS  # one list: --demo-captions replaces its items
# A fixed caching schedule for random-weight models (their residuals never fall under a threshold): compute
# the first 4 steps and the last, then one step in three.
FIXED_MASK_20 = [1, 1, 1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1]


def log(msg: str) -> None:
    print(msg, flush=True)


# ---- workloads
def poisson_arrivals(n: int, mean_gap_s: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(1.0 / mean_gap_s)
    return out


def job(i: int, arrival: float, frames: int, size: int, steps: int, msl: int) -> dict[str, Any]:
    return {
        "id": f"r{i}",
        "arrival": arrival,
        "prompt": PROMPTS[i % len(PROMPTS)],
        "params": {
            "height": size,
            "width": size,
            "num_frames": frames,
            "num_inference_steps": steps,
            "seed": 1000 + i,
            "max_sequence_length": msl,
            "output_format": "tensor",
        },
    }


# ---- runners
def run_plain(pipe, jobs: list[dict]) -> dict[str, dict]:
    """Sequential plain diffusers calls in arrival order: what a user gets without a serving engine."""
    start, results = time.monotonic(), {}
    for j in sorted(jobs, key=lambda j: j["arrival"]):
        wait = start + j["arrival"] - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        p = j["params"]
        out = pipe(
            prompt=j["prompt"],
            height=p["height"],
            width=p["width"],
            num_frames=p["num_frames"],
            num_inference_steps=p["num_inference_steps"],
            max_sequence_length=p["max_sequence_length"],
            generator=torch.Generator().manual_seed(p["seed"]),
            output_type="np",
        )
        finish = time.monotonic() - start
        results[j["id"]] = {"latency": finish - j["arrival"], "finish": finish, "output": out.frames}
    return results


run_engine = diffusion_families.run_engine


def warm(runner, jobs: list[dict]) -> None:
    """One untimed request of the workload's first shape, so no mode pays first-call costs in its figures."""
    first = dict(jobs[0], id="warmup", arrival=0.0)
    runner([first])


def summarize(name: str, results: dict[str, dict], jobs: list[dict], ids: list[str] | None = None) -> dict:
    ids = ids or list(results)
    lat = [results[i]["latency"] for i in ids]
    first = min(j["arrival"] for j in jobs)
    span = max(r["finish"] for r in results.values()) - first
    row = {
        "name": name,
        "requests": len(results),
        "throughput_rps": len(results) / span,
        "p50_s": float(np.percentile(lat, 50)),
        "p99_s": float(np.percentile(lat, 99)),
        "mean_s": statistics.mean(lat),
    }
    log(
        f"  {name:<32} throughput {row['throughput_rps']:.4f} req/s   p50 {row['p50_s']:7.2f} s   "
        f"p99 {row['p99_s']:7.2f} s"
    )
    return row


def make_engine(model: str, threads: int, max_num_seqs: int, **engine_args) -> DiffusionEngine:
    registry.load()  # the step adapters and the rest the families register, as a stage process does
    deploy = StageDeploy(stage_id=0, max_num_seqs=max_num_seqs, dtype="float32", num_threads=threads)
    return DiffusionEngine(model, deploy, engine_args=engine_args)


def plain_pipeline(model: str):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(model, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def step_time(pipe, frames: int, size: int, msl: int, repeats: int = 3) -> float:
    """Seconds per denoise step (both CFG branches) of the transformer at this shape."""
    latent_frames = (frames - 1) // pipe.vae_scale_factor_temporal + 1
    side = size // pipe.vae_scale_factor_spatial
    x = torch.randn(1, pipe.transformer.config.in_channels, latent_frames, side, side)
    text = torch.randn(1, msl, pipe.transformer.config.text_dim)
    t = torch.tensor([500])
    with torch.no_grad():
        pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=text)
        start = time.perf_counter()
        for _ in range(repeats):
            for _ in range(2):
                pipe.transformer(hidden_states=x, timestep=t, encoder_hidden_states=text)
    return (time.perf_counter() - start) / repeats


# ---- sections
def overhead(model: str, args, pipe) -> dict:
    log("\n[1] overhead at concurrency 1 (one request at a time, same seeds)")
    jobs = [job(i, 0.0, args.frames, args.size, args.steps, args.msl) for i in range(args.overhead_repeats)]
    engines = {
        "request": make_engine(model, args.threads, 1, execution="request"),
        "step": make_engine(model, args.threads, 1, execution="step"),
    }
    times: dict[str, list[float]] = {"plain": [], "request": [], "step": []}
    for j in jobs:  # interleaved so load drift hits every mode alike
        times["plain"].append(run_plain(pipe, [j])[j["id"]]["latency"])
        for mode, engine in engines.items():
            times[mode].append(run_engine(engine, [j])[j["id"]]["latency"])
    med = {k: statistics.median(v) for k, v in times.items()}
    for mode in ("request", "step"):
        ratio = 100 * (med[mode] / med["plain"] - 1)
        log(f"  {mode:<8} {med[mode]:.3f} s vs plain {med['plain']:.3f} s: overhead {ratio:+.2f}%")
    return {"median_s": med, "all_s": times}


def poisson(model: str, args, pipe) -> dict:
    shape = f"{args.frames} frames, {args.size}x{args.size}, {args.steps} steps"
    log(f"\n[2] Poisson workload: {args.requests} requests, {shape}, {args.rounds} rounds")
    service = args.step_s * args.steps
    gaps = poisson_arrivals(args.requests, mean_gap_s=args.load * service, seed=args.seed)
    jobs = [job(i, t, args.frames, args.size, args.steps, args.msl) for i, t in enumerate(gaps)]
    log(f"  mean inter-arrival {args.load * service:.2f} s (= {args.load} x one request's service time)")
    request_engine = make_engine(model, args.threads, args.max_num_seqs, execution="request")
    step_engine = make_engine(model, args.threads, args.max_num_seqs, execution="step")
    modes = {
        "plain diffusers (sequential)": lambda js: run_plain(pipe, js),
        "omnistage request mode": lambda js: run_engine(request_engine, js),
        "omnistage step mode": lambda js: run_engine(step_engine, js),
    }
    settings = cache_options(args)
    cached_names = {}  # mode name -> the cache-dit options it runs with
    for options in settings:
        name = "omnistage step mode + cache-dit" + (f" {json.dumps(options)}" if len(settings) > 1 else "")
        cache = {"cache": "cache_dit", "cache_options": options}
        modes[name] = lambda js, cache=cache: run_engine(step_engine, js, cache)
        cached_names[name] = options
    names = list(modes)
    plain_name, step_name = names[0], names[2]
    for run in modes.values():
        warm(run, jobs)
    # The machine's speed drifts over minutes (other load, clocks), by more than the effects measured, so
    # the modes run interleaved: every round runs all of them, starting one mode later than the round before,
    # and each mode is compared with plain from its own round.
    rounds, last = [], {}  # last: the outputs of the latest round (for PSNR and the exactness check)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        log(f"  round {r + 1}/{args.rounds}")
        last = {name: modes[name](jobs) for name in order}
        rows = {name: summarize(name, last[name], jobs) for name in order}
        base = rows[plain_name]["throughput_rps"]
        for row in rows.values():
            row["throughput_vs_plain"] = row["throughput_rps"] / base
        log("    vs plain: " + ", ".join(f"{n} {rows[n]['throughput_vs_plain']:.2f}x" for n in names[1:]))
        rounds.append({"order": order, "rows": [rows[n] for n in names]})
    rows = []
    for k, name in enumerate(names):
        ratios = [rnd["rows"][k]["throughput_vs_plain"] for rnd in rounds]
        rows.append(
            {
                "name": name,
                "throughput_vs_plain": statistics.median(ratios),
                "throughput_vs_plain_by_round": ratios,
                "throughput_rps": statistics.median(rnd["rows"][k]["throughput_rps"] for rnd in rounds),
                "p50_s": statistics.median(rnd["rows"][k]["p50_s"] for rnd in rounds),
                "p99_s": statistics.median(rnd["rows"][k]["p99_s"] for rnd in rounds),
            }
        )
    log(f"  median of {args.rounds} rounds:")
    for row in rows:
        by_round = " ".join(f"{x:.2f}" for x in row["throughput_vs_plain_by_round"])
        log(
            f"  {row['name']:<32} {row['throughput_vs_plain']:.2f}x plain (rounds: {by_round})   "
            f"{row['throughput_rps']:.4f} req/s   p50 {row['p50_s']:7.2f} s   p99 {row['p99_s']:7.2f} s"
        )
    step_mode, plain = last[step_name], last[plain_name]
    caching = []
    for name, options in cached_names.items():
        cached = last[name]
        psnrs = [media.psnr(cached[i]["output"], step_mode[i]["output"]) for i in step_mode]
        computed = [cached[i]["metrics"]["computed_steps"] for i in cached]
        done = f"{statistics.mean(computed):.1f}/{args.steps} steps computed"
        psnr = f"mean {statistics.mean(psnrs):.2f} dB, min {min(psnrs):.2f} dB"
        log(f"  cache-dit {json.dumps(options)} ({done}): PSNR vs uncached {psnr}")
        caching.append({"name": name, "options": options, "psnr_db": psnrs, "computed_steps": computed})
    exact = max(float(np.abs(step_mode[i]["output"] - plain[i]["output"]).max()) for i in plain)
    log(f"  step mode vs plain outputs: max abs diff {exact:.2e}")
    return {
        "rows": rows,
        "rounds": rounds,
        "cache_dit": caching,
        "step_vs_plain_max_abs_diff": exact,
    }


def cache_options(args) -> list[dict]:
    """The cache-dit option sets to run: one JSON object, a JSON list of them, or the fixed schedule."""
    if args.cache_options != "fixed":
        options = json.loads(args.cache_options)
        return options if isinstance(options, list) else [options]
    steps = args.steps
    mask = (
        FIXED_MASK_20
        if steps == 20
        else [1 if i < 2 or i == steps - 1 or i % 3 == 0 else 0 for i in range(steps)]
    )
    return [{"steps_computation_mask": mask, "steps_computation_policy": "static", "max_warmup_steps": 0}]


def short_latency(model: str, args, pipe) -> dict:
    log(f"\n[3] 1 x {args.long_frames}-frame + 7 x {args.short_frames}-frame requests: 9-frame p50 latency")
    # The long request first; the short ones then arrive as a Poisson process at the rate one short request
    # is served (so the shorts alone would keep the engine about busy).
    short_service = step_time(pipe, args.short_frames, args.size, args.msl) * args.steps
    gaps = poisson_arrivals(8, mean_gap_s=short_service, seed=args.seed + 1)
    log(
        f"  short-request service ~{short_service:.2f} s; short arrivals at {[round(g, 2) for g in gaps[1:]]}"
    )
    jobs = [job(0, 0.0, args.long_frames, args.size, args.steps, args.msl)]
    jobs += [job(i, gaps[i], args.short_frames, args.size, args.steps, args.msl) for i in range(1, 8)]
    short_ids = [j["id"] for j in jobs[1:]]
    warm(lambda j: run_plain(pipe, j), jobs[1:])
    fcfs = run_plain(pipe, jobs)
    rows = {"fcfs": summarize("FCFS whole requests (plain)", fcfs, jobs, short_ids)}
    long_latency = {"fcfs": fcfs["r0"]["latency"]}
    # The CPU default token budget (1): every forward holds only the most urgent request (shorts one at a
    # time, in SRPT order); budget 0: all same-shape requests share a forward (on a CPU that costs about as
    # much as running them apart, so every member finishes as late as the last).
    variants = {"step": {}, "step_shared": {"step_token_budget": 0}}
    for name, extra in variants.items():
        engine = make_engine(model, args.threads, 8, execution="step", **extra)
        warm(lambda j, e=engine: run_engine(e, j), jobs[1:])
        result = run_engine(engine, jobs)
        label = "omnistage step mode (srpt, default)" if name == "step" else "step mode, shared forwards"
        rows[name] = summarize(label, result, jobs, short_ids)
        long_latency[name] = result["r0"]["latency"]
    for name in variants:
        better = rows["fcfs"]["p50_s"] / rows[name]["p50_s"]
        log(f"  short-request p50, FCFS -> {name}: {better:.2f}x better")
        rows[name]["improvement"] = better
    log("  the long request: " + ", ".join(f"{k} {v:.2f} s" for k, v in long_latency.items()))
    return {**rows, "long_latency_s": long_latency}


def family_main(args) -> int:
    """Sections 1 and 3 for each `--family`, their figures printed one line each."""
    torch.set_num_threads(args.threads)
    sections = {int(s) for s in args.sections.split(",")}
    report: dict[str, Any] = {"load_before": os.getloadavg()}
    log(f"load average {report['load_before']}, torch threads {args.threads}")
    for name in args.family:
        if 1 in sections:
            log("\n[1] overhead at concurrency 1 (one request at a time, same seeds)")
            report[f"{name}_overhead"] = diffusion_families.overhead(
                name, args.overhead_repeats, args.threads, log
            )
        if 3 in sections:
            log("\n[3] short requests behind a long one")
            report[f"{name}_short"] = diffusion_families.short_latency(name, args.shorts, args.threads, log)
    report["load_after"] = os.getloadavg()
    log(f"\nload average after: {report['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=float))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller workload to check the script")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=384)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--msl", type=int, default=64, help="text sequence length")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument(
        "--load", type=float, default=0.25, help="mean inter-arrival / one request's service time"
    )
    parser.add_argument("--long-frames", type=int, default=81)
    parser.add_argument("--short-frames", type=int, default=9)
    parser.add_argument("--overhead-repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="section 2: interleaved rounds of all modes")
    parser.add_argument("--sections", default="1,2,3")
    parser.add_argument("--model", default=None, help="a Wan pipeline directory instead of the random one")
    parser.add_argument(
        "--demo-captions", action="store_true", help="prompts: the demo model's held-out captions"
    )
    parser.add_argument(
        "--cache-options",
        default="fixed",
        help="cache-dit options as JSON (an object, or a list of objects: one cached mode each), or 'fixed'",
    )
    parser.add_argument("--json", default=None, help="write all figures here")
    parser.add_argument(
        "--family",
        action="append",
        choices=sorted(diffusion_families.FAMILIES),
        help="sections 1 and 3 on this step-wise family's checkpoint instead of Wan (repeatable); see "
        "benchmarks/diffusion_families.py",
    )
    parser.add_argument("--shorts", type=int, default=4, help="--family: short requests behind the long one")
    args = parser.parse_args(argv)
    if args.family:
        return family_main(args)
    if args.quick:
        args.requests, args.frames, args.size, args.steps = 3, 9, 64, 6
        args.long_frames, args.overhead_repeats, args.rounds = 17, 1, 2
    torch.set_num_threads(args.threads)
    model = args.model or str(wan_bench_dir(args.dim, args.heads, args.layers, args.ffn))
    if args.demo_captions:
        from omnistage.demo.evaluate import held_out_scenes

        PROMPTS[:] = [scene.caption for scene in held_out_scenes(1)[1]]
    pipe = plain_pipeline(model)
    args.step_s = step_time(pipe, args.frames, args.size, args.msl)
    log(f"model {model}\nload average {os.getloadavg()}, torch threads {args.threads}")
    log(f"one denoise step (CFG: 2 forwards) at {args.frames}x{args.size}x{args.size}: {args.step_s:.3f} s")
    sections = {int(s) for s in args.sections.split(",")}
    report: dict[str, Any] = {"model": model, "step_s": args.step_s, "load_before": os.getloadavg()}
    if 1 in sections:
        report["overhead"] = overhead(model, args, pipe)
    if 2 in sections:
        report["poisson"] = poisson(model, args, pipe)
    if 3 in sections:
        report["short_latency"] = short_latency(model, args, pipe)
    report["load_after"] = os.getloadavg()
    log(f"\nload average after: {report['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
