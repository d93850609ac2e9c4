"""Qwen-Omni text + audio serving: transformers one request at a time vs omnistage's three-stage pipeline.

`--family qwen2_5_omni` (default) or `qwen3_omni` (MoE thinker → talker + code predictor → code2wav; its
talker tokens are 16-codebook frames at 12.5 Hz, and its baseline is
`Qwen3OmniMoeForConditionalGeneration.generate(return_audio=True)`).

Workload: N requests (different prompts), each answered with text and speech. Every system does the same
work: greedy decoding, exactly `--thinker-tokens` text tokens and `--talker-tokens` codec tokens per request
(min = max tokens), the same seed for the vocoder's noise.

- baseline: `Qwen2_5OmniForConditionalGeneration.generate(return_audio=True)`, one request at a time (the
  baseline of the vLLM-Omni paper), with every core;
- omnistage full handoff: the default deployment (thinker, talker and two code2wav replicas, one process
  each), every stage starting a request once the stage before it has finished it (code2wav decodes each
  request once its codes are complete);
- omnistage async chunk: the same, with the talker speaking while the thinker is still writing and
  code2wav decoding chunks while the talker is still speaking.
Every omnistage stage serves at most `--concurrency` requests at once (its `max_num_seqs`). Arrival,
`--arrival`:
- `closed` (default): the client keeps `--concurrency` requests in flight, sending the next when one
  completes, and each request's times run from its send. This is what `vllm bench serve --max-concurrency
  8 --request-rate inf` does, which is how vLLM-Omni's benchmarks set "concurrency". The baseline server
  answers one request at a time in arrival order, so a baseline request's times include its wait in that
  queue (it is sent when the request `--concurrency` places ahead of it finishes).
- `burst`: all N requests arrive at t0 and every time runs from t0, so requests that wait for a stage slot
  (the second wave) count their wait.

Job completion time (JCT) of a request = its completion − its start; time to first audio (TTFA) = its first
audio chunk − its start (the baseline returns audio only at the end). Reported: mean and p99 over the N
requests, the makespan, and the ratios the issue sets targets for (JCT ≤ 0.2× baseline, TTFA async ≤ 0.25×
full). Async chunk is lossy at chunk edges: its max abs waveform difference from full handoff is printed.
The contestants run in `--rounds` interleaved rounds (default 3, each starting one contestant later); every
ratio is taken within a round and the median over rounds is reported with each round's value.

    python benchmarks/omni_pipeline.py [--size bench] [--requests 16] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repo's benchmarks package
from benchmarks.omni_requests import closed_loop, timed  # noqa: E402
from omnistage import AsyncOmni, GenerationParams, SamplingParams  # noqa: E402
from omnistage.families.qwen2_5_omni.processor import load_processor, prompt_to_inputs  # noqa: E402
from omnistage.families.qwen2_5_omni.tiny import qwen2_5_omni_dir  # noqa: E402
from omnistage.families.qwen3_omni.checkpoint import qwen3_omni_dir  # noqa: E402

TOPICS = ["cats", "rain", "trains", "the sea", "music", "bread", "winter", "rivers"]


@dataclasses.dataclass(frozen=True)
class Family:
    """What differs between the Qwen-Omni families here."""

    title: str
    model_dir: Callable[[str], Path]
    reference_class: str  # the transformers composite model
    processor_class: str
    samples_per_token: int  # 24 kHz samples per talker token
    # Qwen2.5-Omni's reference needs one masked pad token (tests/qwen2_5_omni/omni_reference.py)
    left_pad: bool
    talker_extra_token: int  # the Qwen3-Omni reference makes no frame of its last talker token
    seeded_code2wav: bool
    targets: tuple[float, float]  # the (TTFA async / full, JCT / transformers) targets


FAMILIES = {
    "qwen2_5_omni": Family(
        "Qwen2.5-Omni",
        qwen2_5_omni_dir,
        "Qwen2_5OmniForConditionalGeneration",
        "Qwen2_5OmniProcessor",
        480,
        True,
        0,
        True,
        (0.25, 0.2),
    ),
    "qwen3_omni": Family(
        "Qwen3-Omni",
        qwen3_omni_dir,
        "Qwen3OmniMoeForConditionalGeneration",
        "Qwen3OmniMoeProcessor",
        1920,
        False,
        1,
        False,
        (0.2, 0.15),
    ),
}


def prompts(n: int) -> list[str]:
    return [f"Tell me something about {TOPICS[i % len(TOPICS)]}." + " Please." * (i % 4) for i in range(n)]


def summarize(name: str, jct: list[float], ttfa: list[float]) -> dict[str, float]:
    row = {
        "jct_mean": float(np.mean(jct)),
        "jct_p99": float(np.percentile(jct, 99)),
        "ttfa_mean": float(np.mean(ttfa)),
        "ttfa_p99": float(np.percentile(ttfa, 99)),
        "makespan": max(jct),
    }
    print(
        f"{name:26s} JCT mean {row['jct_mean']:7.2f} s  p99 {row['jct_p99']:7.2f} s   "
        f"TTFA mean {row['ttfa_mean']:7.2f} s  p99 {row['ttfa_p99']:7.2f} s   "
        f"makespan {row['makespan']:7.2f} s",
        flush=True,
    )
    # Sorted, so the waves a stage's concurrency limit makes (requests waiting for a slot) are visible.
    print("  TTFA per request, sorted (s): " + " ".join(f"{t:.1f}" for t in sorted(ttfa)), flush=True)
    return row


def max_diff(waves: list[torch.Tensor], others: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(waves, others, strict=True))


class Baseline:
    """transformers `generate(return_audio=True)`, one request at a time; the model is loaded once."""

    def __init__(self, model_dir: str, args: argparse.Namespace):
        import transformers

        family = FAMILIES[args.family]
        torch.set_num_threads(args.baseline_threads)
        self.model = (
            getattr(transformers, family.reference_class)
            .from_pretrained(model_dir, dtype=torch.float32)
            .eval()
        )
        self.processor = load_processor(model_dir, getattr(transformers, family.processor_class))
        self.args = args
        self.left_pad = family.left_pad
        talker_tokens = args.talker_tokens + family.talker_extra_token
        self.kwargs = dict(
            thinker_max_new_tokens=args.thinker_tokens,
            thinker_min_new_tokens=args.thinker_tokens,
            thinker_do_sample=False,
            talker_max_new_tokens=talker_tokens,
            talker_min_new_tokens=talker_tokens,
            talker_do_sample=False,
        )
        self.one(prompts(1)[0])  # warm-up

    def one(self, text: str) -> torch.Tensor:
        inputs = dict(prompt_to_inputs(self.processor, text))
        if self.left_pad:
            # One masked pad token keeps transformers on the talker's designed path (codec BOS/pad
            # embeddings, multimodal positions; see tests/qwen2_5_omni/omni_reference.py), which omnistage
            # computes.
            inputs["input_ids"] = torch.nn.functional.pad(inputs["input_ids"], (1, 0), value=151643)
            inputs["attention_mask"] = torch.nn.functional.pad(inputs["attention_mask"], (1, 0), value=0)
        torch.manual_seed(0)
        return self.model.generate(**inputs, **self.kwargs)[1].reshape(-1)

    def run(self, texts: list[str]) -> tuple[dict, list]:
        args = self.args
        t0 = time.perf_counter()
        finished, waves = [], []
        for text in texts:
            waves.append(self.one(text))
            finished.append(time.perf_counter() - t0)
        # The server runs requests one at a time, in arrival order. burst: all were sent at t0. closed: the
        # client sends the first `concurrency` at t0 and each later one when a response frees its slot, i.e.
        # request i is sent when request i - concurrency finishes; its queue wait counts, as a client sees it.
        sent = [
            0.0 if args.arrival == "burst" or i < args.concurrency else finished[i - args.concurrency]
            for i in range(len(texts))
        ]
        done = [end - start for end, start in zip(finished, sent, strict=True)]
        return summarize("transformers, one at a time", done, done), waves


async def run_omnistage(model_dir: str, texts: list[str], args: argparse.Namespace, async_chunk: bool):
    name = "omnistage async chunk" if async_chunk else "omnistage full handoff"
    started = time.perf_counter()
    overrides = {str(i): {"max_num_seqs": args.concurrency} for i in range(3)}
    overrides["1"]["async_chunk"] = overrides["2"]["async_chunk"] = async_chunk
    for i, threads in enumerate(args.stage_threads):
        overrides[str(i)]["num_threads"] = threads
    for i, replicas in enumerate(args.stage_replicas):
        overrides[str(i)]["replicas"] = replicas
    omni = AsyncOmni(model_dir, stage_overrides=overrides)
    print(f"{name}: stages ready in {time.perf_counter() - started:.1f} s", flush=True)
    params = [
        SamplingParams(temperature=0, max_tokens=args.thinker_tokens, min_tokens=args.thinker_tokens),
        SamplingParams(
            temperature=0,
            max_tokens=args.talker_tokens,
            min_tokens=args.talker_tokens,
            repetition_penalty=1.05,
        ),
        GenerationParams(seed=0) if FAMILIES[args.family].seeded_code2wav else None,
    ]

    try:
        await timed(omni, texts[0], params)  # warm-up
        t0 = time.perf_counter()
        if args.arrival == "burst":  # all sent at t0
            results = await asyncio.gather(*(timed(omni, text, params, began=t0) for text in texts))
        else:
            results = await closed_loop(omni, texts, params, args.concurrency)
    finally:
        await omni.shutdown()
    marks = [r["metrics"] for r in results]
    row = summarize(name, [r["jct"] for r in results], [r["ttfa"] for r in results])
    keys = ("stage0_done_s", "stage1_first_s", "stage1_done_s", "first_audio_s", "e2e_s")
    means = {k: np.mean([m[k] for m in marks if k in m]) for k in keys if any(k in m for m in marks)}
    print("  stage marks, mean s from arrival: " + ", ".join(f"{k} {v:.2f}" for k, v in means.items()))
    # When each request's talker began speaking: a request's audio cannot start before that.
    talker = sorted(m["stage1_first_s"] for m in marks if "stage1_first_s" in m)
    print("  talker first codec token per request, sorted (s): " + " ".join(f"{t:.1f}" for t in talker))
    return row, [r["wave"] for r in results]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", default="qwen2_5_omni", choices=sorted(FAMILIES))
    parser.add_argument("--size", default="bench", choices=["tiny", "bench"])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8, help="requests each stage serves at once")
    parser.add_argument("--thinker-tokens", type=int, default=24)
    parser.add_argument(
        "--talker-tokens",
        type=int,
        default=None,
        help="codec tokens (Qwen3-Omni: frames) per request; default 288 (Qwen2.5-Omni), 72 (Qwen3-Omni): "
        "5.8 s of audio either way",
    )
    parser.add_argument(
        "--arrival",
        default="closed",
        choices=["burst", "closed"],
        help="burst: all requests at t0, every stage capped at --concurrency, times from t0; closed: the "
        "client keeps --concurrency requests in flight, times from each request's send",
    )
    parser.add_argument(
        "--skip-baseline", action="store_true", help="omnistage only (the JCT ratios need the baseline)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved repetitions; ratios are per round, then the median"
    )
    parser.add_argument(
        "--baseline-threads",
        type=int,
        default=os.cpu_count(),
        help="torch threads for the transformers baseline (default: every core, as omnistage's stage "
        "processes together use every core)",
    )
    # Per-stage deployment overrides (thinker, talker, code2wav), e.g. 1,1,2; default: the deployment's.
    for flag, what in (("--stage-threads", "torch threads"), ("--stage-replicas", "processes (replicas)")):
        parser.add_argument(
            flag, type=lambda text: [int(n) for n in text.split(",")], default=[], help=f"{what} per stage"
        )
    args = parser.parse_args()
    family = FAMILIES[args.family]
    if args.talker_tokens is None:
        args.talker_tokens = 288 * 480 // family.samples_per_token
    model_dir = str(family.model_dir(args.size))
    texts = prompts(args.requests)
    print(
        f"{family.title} ({args.size}) {model_dir}: {args.requests} requests, "
        f"concurrency {args.concurrency}, "
        f"arrival {args.arrival}, {args.thinker_tokens} text + {args.talker_tokens} codec tokens each "
        f"({args.talker_tokens * family.samples_per_token / 24000:.1f} s of audio); baseline threads "
        f"{args.baseline_threads}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    runs = {
        "full": lambda: asyncio.run(run_omnistage(model_dir, texts, args, async_chunk=False)),
        "async": lambda: asyncio.run(run_omnistage(model_dir, texts, args, async_chunk=True)),
    }
    if args.skip_baseline:
        print("transformers baseline: SKIPPED (--skip-baseline); no JCT ratios in this run")
    else:
        baseline = Baseline(model_dir, args)
        runs["baseline"] = lambda: baseline.run(texts)
    # Interleaved rounds, each starting one contestant later: the machine's speed drifts between runs far
    # more than the effects measured, and a ratio taken within one round sees one speed.
    ratios: dict[str, list[float]] = {}
    for r in range(args.rounds):
        names = list(runs)[r % len(runs) :] + list(runs)[: r % len(runs)]
        print(f"--- round {r + 1} of {args.rounds}: {', '.join(names)}", flush=True)
        rows, waves = {}, {}
        for name in names:
            rows[name], waves[name] = runs[name]()
        found = {"TTFA async / full handoff": rows["async"]["ttfa_mean"] / rows["full"]["ttfa_mean"]}
        if "baseline" in rows:
            found["JCT full handoff / transformers"] = rows["full"]["jct_mean"] / rows["baseline"]["jct_mean"]
            found["JCT async chunk / transformers"] = rows["async"]["jct_mean"] / rows["baseline"]["jct_mean"]
        for key, value in found.items():
            ratios.setdefault(key, []).append(value)
        print("  round ratios (means): " + ", ".join(f"{k} {v:.3f}x" for k, v in found.items()), flush=True)
        drift = max_diff(waves["async"], waves["full"])
        print(f"  async chunk vs full handoff waveform: max abs diff {drift:.2e}")
        if "baseline" in waves:
            exact = max_diff(waves["full"], waves["baseline"])
            print(f"  full handoff vs transformers waveform: max abs diff {exact:.2e}")
    print("median over rounds (every round's in brackets):")
    for key, values in ratios.items():
        target = family.targets[0] if key.startswith("TTFA") else family.targets[1]
        listed = " ".join(f"{v:.3f}" for v in values)
        print(f"  {key}: {statistics.median(values):.3f}x [{listed}] (target <= {target})")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
