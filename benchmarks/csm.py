"""Sesame CSM serving against its reference, in one run, on a checkpoint with csm-1b's widths and fewer
layers (omnistage/families/csm/tiny.py `BENCH`: backbone 2048 wide, 4 of 16 layers; depth decoder 1024 wide,
2 of 4 layers; 32 codebooks of 2051 codes; the released Mimi's widths; random weights, so no frame is the
all-EOS one and every request speaks its whole frame budget).

The reference (transformers' `CsmForConditionalGeneration`) speaks each text as its users call it, one
request at a time on every core: `AutoProcessor.apply_chat_template`, then greedy `generate(...,
output_audio=True)`; it gives no audio before the whole waveform. omnistage serves the same greedy requests
through `AsyncOmni` on the family's default deployment (backbone and Mimi decoder each in its own process,
async chunk) and streams: time to first audio at concurrency 1, audio-seconds per second at concurrency 8 (a
closed loop of 8 in flight), RTF (a request's latency / its audio length, p50). Targets (issue 55): time to
first audio ≤ 0.25x the reference's time to its whole waveform, audio-seconds per second ≥ 3x the
reference's.

Both sides compute in the same dtype: the checkpoint's (`--dtype`, float32 or bfloat16; bf16 where the CPU
computes it natively, AVX512-BF16 or AMX).

    python benchmarks/csm.py [--requests 8] [--frames 32] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnistage import AsyncOmni, SamplingParams  # noqa: E402
from omnistage.families.csm.tiny import bench_csm_dir  # noqa: E402
from omnistage.prompts import SpeechPrompt  # noqa: E402

RATE = 24000
SPEAKER = 0
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


def run_reference(model_dir: Path, texts: list[str], frames: int, dtype: str) -> dict:
    """One request at a time, every core, as the model card calls it."""
    from transformers import AutoProcessor, CsmForConditionalGeneration

    torch.set_num_threads(os.cpu_count() or 1)
    processor = AutoProcessor.from_pretrained(str(model_dir))
    model = CsmForConditionalGeneration.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).eval()

    def one(text: str) -> tuple[float, torch.Tensor]:
        began = time.perf_counter()
        conversation = [{"role": str(SPEAKER), "content": [{"type": "text", "text": text}]}]
        inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        with torch.inference_mode():
            audio = model.generate(
                **inputs,
                max_new_tokens=frames,
                do_sample=False,
                depth_decoder_do_sample=False,
                output_audio=True,
            )
        return time.perf_counter() - began, audio[0].float().reshape(-1)

    one(texts[0])  # warm-up
    started = time.perf_counter()
    results = [one(text) for text in texts]
    wall = time.perf_counter() - started
    model = None  # freed before omnistage loads its own
    gc.collect()
    audio = [len(r[1]) / RATE for r in results]
    return {
        "ttfa_p50": statistics.median(r[0] for r in results),  # its first audio is its whole waveform
        "rtf_p50": statistics.median(r[0] / a for r, a in zip(results, audio, strict=True)),
        "audio_per_s": sum(audio) / wall,
        "wavs": [r[1] for r in results],
    }


async def run_omnistage(
    model_dir: Path, texts: list[str], frames: int, concurrency: int, dtype: str, async_chunk: bool = True
) -> dict:
    overrides = {
        "0": {"max_num_seqs": max(concurrency, 1), "dtype": dtype},
        "1": {"async_chunk": async_chunk, "dtype": dtype},
    }
    omni = AsyncOmni(str(model_dir), stage_overrides=overrides)
    params = [SamplingParams(temperature=0.0, max_tokens=frames), None]

    async def one(text: str) -> tuple[float, float, torch.Tensor]:
        began, first = time.perf_counter(), None
        async for out in omni.generate(SpeechPrompt(input=text, speaker=str(SPEAKER)), params):
            if first is None and out.delta_audio is not None and out.delta_audio.numel():
                first = time.perf_counter() - began
            if out.finished:
                if out.error is not None:
                    raise RuntimeError(out.error)
                return first, time.perf_counter() - began, out.audio.reshape(-1)
        raise RuntimeError("no terminal output")

    try:
        await one(texts[0])  # warm-up
        slots = asyncio.Semaphore(concurrency)

        async def in_a_slot(text: str) -> tuple[float, float, torch.Tensor]:
            async with slots:
                return await one(text)

        started = time.perf_counter()
        results = await asyncio.gather(*(in_a_slot(text) for text in texts))
        wall = time.perf_counter() - started
    finally:
        await omni.shutdown()
    audio = [len(r[2]) / RATE for r in results]
    return {
        "ttfa_p50": statistics.median(r[0] for r in results),
        "rtf_p50": statistics.median(r[1] / a for r, a in zip(results, audio, strict=True)),
        "audio_per_s": sum(audio) / wall,
        "wavs": [r[2] for r in results],
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
    parser.add_argument("--frames", type=int, default=32, help="frames per request (12.5 a second of audio)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both sides'")
    args = parser.parse_args()
    started = time.perf_counter()
    model_dir = bench_csm_dir(args.dtype)
    texts = [TEXTS[i % len(TEXTS)] for i in range(args.requests)]
    print(
        f"CSM bench checkpoint {model_dir} (ready in {time.perf_counter() - started:.0f} s): {args.requests} "
        f"requests of {args.frames} frames ({args.frames / 12.5:.1f} s of audio) each; {args.dtype}; "
        f"{os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    ref = run_reference(model_dir, texts, args.frames, args.dtype)
    print(f"reference, one at a time: time to whole waveform p50 {ref['ttfa_p50']:.2f} s", flush=True)
    solo = asyncio.run(run_omnistage(model_dir, texts, args.frames, 1, args.dtype))
    print(f"omnistage c=1: time to first audio p50 {solo['ttfa_p50']:.3f} s", flush=True)
    many = asyncio.run(run_omnistage(model_dir, texts, args.frames, 8, args.dtype))
    whole = asyncio.run(run_omnistage(model_dir, texts, args.frames, 8, args.dtype, async_chunk=False))
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
        f"{many['audio_per_s'] / ref['audio_per_s']:.2f}x (target >= 3x); full handoff "
        f"{whole['audio_per_s'] / ref['audio_per_s']:.2f}x\n"
        f"waveform max |omnistage - reference|: full handoff {max_diff(whole['wavs'], ref['wavs']):.2e}; "
        f"async chunk (each chunk continuing its stream; the reference decodes in one pass) "
        f"c=1 {max_diff(solo['wavs'], ref['wavs']):.2e}, c=8 {max_diff(many['wavs'], ref['wavs']):.2e}"
    )


if __name__ == "__main__":
    main()
