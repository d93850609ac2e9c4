"""Qwen3-TTS serving against its reference, in one run, on a CustomVoice checkpoint with the 0.6B model's
widths and fewer layers (tests/qwen3_tts/reference/worker.py `build_bench`: talker 1024 wide, 4 of 28
layers; code predictor 1024 wide, 2 of 5; the 12 Hz codec decoder at its released widths, 2 of 8
transformer layers; random weights, the EOS row zeroed so every request speaks its whole frame budget).

The reference (qwen-tts-hf on transformers 5.17, in its own venv: `make qwen3-tts-reference`) speaks each
text as a user calls it, one request at a time on every core: greedy `generate`, then the codec's `decode`;
it gives no audio before the whole waveform. omnistage serves the same greedy requests through `AsyncOmni`
on the family's default deployment (talker and codec decoder each in its own process, async chunk) and
streams: time to first audio at concurrency 1, audio-seconds per second at concurrency 8 (a closed loop of
8 in flight), RTF (a request's latency / its audio length, p50) at both. Targets (issue 28): time to first
audio ≤ 0.25x the reference's time to its whole waveform, audio-seconds per second ≥ 4x the reference's.

Both sides compute in the same dtypes: float32 by default (the checkpoint's), or as asked with
`--talker-dtype` (talker and code predictor) and `--codec-dtype` (the codec decoder); the reference casts its
modules as a user would (`.to(dtype)`), omnistage deploys the stages with that `dtype`.

    python benchmarks/qwen3_tts.py [--requests 8] [--frames 40] [--talker-dtype float32|bfloat16]
                                   [--codec-dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the reference's worker and venv helpers live with the family's tests

from benchmarks.omni_requests import closed_loop, timed  # noqa: E402
from benchmarks.tts_against_reference import TEXTS  # noqa: E402
from omnistage import AsyncOmni, SamplingParams  # noqa: E402
from omnistage.cache import cached_dir  # noqa: E402
from tests.qwen3_tts.reference_outputs import STAMP, WORKER, call_reference, reference_venv  # noqa: E402

RATE = 24000
SPEAKER, LANGUAGE = "ryan", "English"
CODEBOOK, EOS = 2048, 2150


def bench_dir() -> Path:
    """The benchmark checkpoint, built once per machine by the reference's own classes."""
    version = hashlib.sha256(WORKER.read_bytes()).hexdigest()[:12]
    return cached_dir(
        "qwen3-tts-bench-custom_voice", version, lambda path: call_reference("build_bench", str(path))
    )


def reference_requests(model_dir: Path, texts: list[str], frames: int) -> list[dict]:
    """The reference's own prompt strings (its `_build_assistant_text`); its max_new_tokens N gives N - 1
    frames."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    wrap = "<|im_start|>assistant\n{}<|im_end|>\n<|im_start|>assistant\n"
    return [
        {"input_ids": tokenizer(wrap.format(text))["input_ids"], "language": LANGUAGE.lower(),
         "speaker": SPEAKER, "non_streaming_mode": True, "max_new_tokens": frames + 1}
        for text in texts
    ]  # fmt: skip


def run_reference(model_dir: Path, texts: list[str], frames: int, dtypes: tuple[str, str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec, out = Path(tmp) / "requests.json", Path(tmp) / "out.pt"
        spec.write_text(json.dumps(reference_requests(model_dir, texts, frames)))
        call_reference("bench", str(model_dir), str(spec), str(out), *dtypes)
        got = torch.load(out)
    audio = [len(w) / RATE for w in got["wavs"]]
    seconds = got["seconds"]
    return {
        "ttfa_p50": statistics.median(seconds),  # its first audio is its whole waveform
        "rtf_p50": statistics.median(s / a for s, a in zip(seconds, audio, strict=True)),
        "audio_per_s": sum(audio) / sum(seconds),
        "wavs": got["wavs"],
    }


def talker_params(frames: int) -> SamplingParams:
    """The reference's greedy: repetition penalty 1.05, codes 2048.. suppressed but EOS, at least 2."""
    return SamplingParams(
        temperature=0.0,
        max_tokens=frames,
        min_tokens=2,
        repetition_penalty=1.05,
        allowed_token_ids=[*range(CODEBOOK), EOS],
    )


async def run_omnistage(
    model_dir: Path,
    texts: list[str],
    frames: int,
    concurrency: int,
    dtypes: tuple[str, str],
    async_chunk: bool = True,
) -> dict:
    overrides = {
        "0": {"max_num_seqs": max(concurrency, 1), "dtype": dtypes[0]},
        "1": {"async_chunk": async_chunk, "dtype": dtypes[1]},
    }
    omni = AsyncOmni(str(model_dir), stage_overrides=overrides)
    params = [talker_params(frames), None]

    prompts = [{"task": "speech", "input": t, "speaker": SPEAKER, "language": LANGUAGE} for t in texts]
    try:
        await timed(omni, prompts[0], params)  # warm-up
        started = time.perf_counter()
        results = await closed_loop(omni, prompts, params, concurrency)
        wall = time.perf_counter() - started
    finally:
        await omni.shutdown()
    audio = [len(r["wave"]) / RATE for r in results]
    return {
        "ttfa_p50": statistics.median(r["ttfa"] for r in results),
        "rtf_p50": statistics.median(r["jct"] / a for r, a in zip(results, audio, strict=True)),
        "audio_per_s": sum(audio) / wall,
        "wavs": [r["wave"] for r in results],
    }


def max_diff(waves: list[torch.Tensor], others: list[torch.Tensor]) -> float:
    if any(len(a) != len(b) for a, b in zip(waves, others, strict=True)):
        return float("inf")
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(waves, others, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=8, help="requests per side (texts cycle)")
    parser.add_argument("--frames", type=int, default=40, help="frames per request (12.5 a second of audio)")
    kinds = ("float32", "bfloat16")
    parser.add_argument("--talker-dtype", choices=kinds, default="float32", help="both sides' talker")
    parser.add_argument("--codec-dtype", choices=kinds, default="float32", help="both sides' codec")
    args = parser.parse_args()
    dtypes = (args.talker_dtype, args.codec_dtype)
    if not (reference_venv() / STAMP).exists():
        sys.exit(f"the Qwen3-TTS reference venv {reference_venv()} is absent: run `make qwen3-tts-reference`")
    started = time.perf_counter()
    model_dir = bench_dir()
    texts = [TEXTS[i % len(TEXTS)] for i in range(args.requests)]
    print(
        f"Qwen3-TTS bench checkpoint {model_dir} (ready in {time.perf_counter() - started:.0f} s): "
        f"{args.requests} requests of {args.frames} frames ({args.frames / 12.5:.1f} s of audio) each; "
        f"talker {dtypes[0]}, codec {dtypes[1]}; "
        f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    ref = run_reference(model_dir, texts, args.frames, dtypes)
    print(f"reference, one at a time: time to whole waveform p50 {ref['ttfa_p50']:.2f} s", flush=True)
    solo = asyncio.run(run_omnistage(model_dir, texts, args.frames, 1, dtypes))
    print(f"omnistage c=1: time to first audio p50 {solo['ttfa_p50']:.3f} s", flush=True)
    many = asyncio.run(run_omnistage(model_dir, texts, args.frames, 8, dtypes))
    whole = asyncio.run(run_omnistage(model_dir, texts, args.frames, 8, dtypes, async_chunk=False))
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
        f"(target <= 0.25x)\naudio-seconds per second, c=8 / reference: "
        f"{many['audio_per_s'] / ref['audio_per_s']:.2f}x (target >= 4x); full handoff "
        f"{whole['audio_per_s'] / ref['audio_per_s']:.2f}x\n"
        f"waveform max |omnistage - reference|: full handoff {max_diff(whole['wavs'], ref['wavs']):.2e}; "
        f"async chunk (25-frame chunks, each continuing its stream; the reference decodes in one pass) "
        f"c=1 {max_diff(solo['wavs'], ref['wavs']):.2e}, c=8 {max_diff(many['wavs'], ref['wavs']):.2e}"
    )


if __name__ == "__main__":
    main()
