"""What the codec-TTS benchmarks share (benchmarks/csm.py, dia.py, higgs_audio_v2.py): omnistage serving a
family's greedy requests through `AsyncOmni` on its default deployment, streamed (time to first audio, RTF,
audio-seconds per second at a concurrency), and the table and ratios against the family's reference run
one request at a time."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.omni_requests import closed_loop, timed
from omnistage import AsyncOmni, SamplingParams

# The texts the TTS benchmarks speak (one speaker each; a family with speaker tags marks them its way)
TEXTS = [
    "The weather is nice today. We could take a walk in the park after lunch.",
    "Please open the door for me. My hands are full of groceries.",
    "I would like a cup of coffee, with a little milk and no sugar.",
    "Turn left at the next corner; the station is on your right.",
    "Good morning, everyone. Today we will talk about the printing press.",
    "The train to the city leaves at seven. Be sure to arrive early.",
    "She opened the window and listened to the rain falling on the roof.",
    "Thank you for calling. Your order has shipped and should arrive on Friday.",
]


async def run_omnistage(
    model_dir: Path,
    prompts: list[Any],
    frames: int,
    concurrency: int,
    dtype: str,
    rate: int,
    async_chunk: bool = True,
    extra: dict | None = None,
    sampling: dict | None = None,
    rows_per_request: int = 1,
) -> dict:
    """`prompts` as the family's speech prompts; greedy, `frames` frames at most. `extra`: more stage
    overrides, by stage id (a deployment to try); `sampling`: more of stage 0's SamplingParams;
    `rows_per_request`: 2 where a request decodes beside a guidance twin (max_num_seqs counts both)."""
    overrides = {
        "0": {"max_num_seqs": max(concurrency, 1) * rows_per_request, "dtype": dtype},
        "1": {"async_chunk": async_chunk, "dtype": dtype},
    }
    for stage, more in (extra or {}).items():
        overrides[stage] = {**overrides.get(stage, {}), **more}
    omni = AsyncOmni(str(model_dir), stage_overrides=overrides)
    params = [SamplingParams(temperature=0.0, max_tokens=frames, **(sampling or {})), None]

    try:
        await timed(omni, prompts[0], params)  # warm-up
        started = time.perf_counter()
        results = await closed_loop(omni, prompts, params, concurrency)
        wall = time.perf_counter() - started
    finally:
        await omni.shutdown()
    audio = [len(r["wave"]) / rate for r in results]
    return {
        "ttfa_p50": statistics.median(r["ttfa"] for r in results),
        "rtf_p50": statistics.median(r["jct"] / a for r, a in zip(results, audio, strict=True)),
        "audio_per_s": sum(audio) / wall,
        "wavs": [r["wave"] for r in results],
    }


def run_reference(one: Callable[[Any], torch.Tensor], prompts: list[Any], rate: int) -> dict:
    """`one(prompt)` → the whole waveform, one request at a time (its first audio is its whole waveform)."""

    def timed(prompt: Any) -> tuple[float, torch.Tensor]:
        began = time.perf_counter()
        wave = one(prompt)
        return time.perf_counter() - began, wave.float().reshape(-1)

    timed(prompts[0])  # warm-up
    started = time.perf_counter()
    results = [timed(p) for p in prompts]
    wall = time.perf_counter() - started
    audio = [len(r[1]) / rate for r in results]
    return {
        "ttfa_p50": statistics.median(r[0] for r in results),
        "rtf_p50": statistics.median(r[0] / a for r, a in zip(results, audio, strict=True)),
        "audio_per_s": sum(audio) / wall,
        "wavs": [r[1] for r in results],
    }


def max_diff(waves: list[torch.Tensor], others: list[torch.Tensor]) -> float:
    if any(len(a) != len(b) for a, b in zip(waves, others, strict=True)):
        return float("inf")
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(waves, others, strict=True))


def compare(
    model_dir: Path,
    prompts: list[Any],
    frames: int,
    dtype: str,
    rate: int,
    ref: dict,
    targets: tuple,
    sampling: dict | None = None,
    rows_per_request: int = 1,
) -> None:
    """omnistage at c=1, c=8 and c=8 in full handoff against `ref`; prints the table and the ratios against
    `targets` (time to first audio at most, audio-seconds per second at least). `sampling`: more of stage
    0's SamplingParams (greedy otherwise); `rows_per_request` as `run_omnistage`'s."""
    kw = {"sampling": sampling, "rows_per_request": rows_per_request}
    solo = asyncio.run(run_omnistage(model_dir, prompts, frames, 1, dtype, rate, **kw))
    print(f"omnistage c=1: time to first audio p50 {solo['ttfa_p50']:.3f} s", flush=True)
    many = asyncio.run(run_omnistage(model_dir, prompts, frames, 8, dtype, rate, **kw))
    whole = asyncio.run(run_omnistage(model_dir, prompts, frames, 8, dtype, rate, async_chunk=False, **kw))
    rows = [
        ("reference, one at a time", ref),
        ("omnistage, concurrency 1", solo),
        ("omnistage, concurrency 8", many),
        ("omnistage, c=8, full handoff", whole),
    ]
    print(f"\n{'':28} {'TTFA p50 s':>11} {'RTF p50':>8} {'audio-s/s':>10}")
    for name, row in rows:
        print(f"{name:28} {row['ttfa_p50']:11.3f} {row['rtf_p50']:8.3f} {row['audio_per_s']:10.3f}")
    print(
        f"\ntime to first audio, c=1 / reference's whole waveform: {solo['ttfa_p50'] / ref['ttfa_p50']:.3f}x "
        f"(target <= {targets[0]}x)\naudio-seconds per second, c=8 / reference: "
        f"{many['audio_per_s'] / ref['audio_per_s']:.2f}x (target >= {targets[1]}x); full handoff "
        f"{whole['audio_per_s'] / ref['audio_per_s']:.2f}x\n"
        f"waveform max |omnistage - reference|: full handoff {max_diff(whole['wavs'], ref['wavs']):.2e}; "
        f"async chunk c=1 {max_diff(solo['wavs'], ref['wavs']):.2e}, "
        f"c=8 {max_diff(many['wavs'], ref['wavs']):.2e}"
    )


def bench_main(
    doc: str,
    name: str,
    bench_dir: Callable[[str], Path],
    reference: Callable[[Path, int, str], Callable[[Any], torch.Tensor]],
    texts: list[str],
    rate: int,
    frames: tuple[int, str],
    prompt: Callable[[str], Any] | None = None,
    **compare_kwargs: Any,
) -> None:
    """A TTS family's benchmark: its command line (--requests, --frames, --dtype), its bench checkpoint, the
    reference one request at a time on every core, then `compare` (targets: first audio ≤ 0.25x the
    reference's whole waveform, audio-seconds per second at c=8 ≥ 3x). `frames`: the default count and what
    a frame is; `prompt`: a text's speech prompt (SpeechPrompt(input=text) by default)."""
    import argparse
    import gc
    import os

    from omnistage.prompts import SpeechPrompt

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=8, help="requests per side (texts cycle)")
    parser.add_argument(
        "--frames", type=int, default=frames[0], help=f"frames per request at most ({frames[1]})"
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both sides'")
    args = parser.parse_args()
    started = time.perf_counter()
    model_dir = bench_dir(args.dtype)
    chosen = [texts[i % len(texts)] for i in range(args.requests)]
    print(
        f"{name} bench checkpoint {model_dir} (ready in {time.perf_counter() - started:.0f} s): "
        f"{args.requests} requests of up to {args.frames} frames; {args.dtype}; {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    torch.set_num_threads(os.cpu_count() or 1)  # the reference on every core
    ref = run_reference(reference(model_dir, args.frames, args.dtype), chosen, rate)
    gc.collect()
    print(f"reference, one at a time: time to whole waveform p50 {ref['ttfa_p50']:.2f} s", flush=True)
    prompts = [(prompt or (lambda t: SpeechPrompt(input=t)))(t) for t in chosen]
    compare(model_dir, prompts, args.frames, args.dtype, rate, ref, (0.25, 3), **compare_kwargs)
