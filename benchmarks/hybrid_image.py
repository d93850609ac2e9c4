"""AR→image hybrids against their reference pipelines, in one run.

Janus-Pro (`--family janus`) on a checkpoint with Janus-Pro-1B's LM widths and a quarter of its layers
(omnistage/families/janus/tiny.py `BENCH`: a 6-layer, 2048-wide Llama, 384x384 images of 576 tokens from a
16384-entry codebook, the VQ decoder at a quarter of its base width; random weights). The reference
(transformers' `JanusForConditionalGeneration`) renders each prompt as the model card does:
`generate(generation_mode="image")` (its doubled CFG batch, guidance 5) then `decode_image_tokens` and the
image processor's 8-bit conversion. Both sides pick tokens greedily (`do_sample=False` there, `top_k: 1`
here), so the images compare.

GLM-Image (`--family glm_image`) on omnistage/families/glm_image/tiny.py `BENCH` (a 4-layer, 2048-wide AR
model with the real 16384-entry codebook, a 4-layer DiT; 256x256 images: 256 preview + 64 target tokens,
then 8 denoising steps with CFG). The reference is one `GlmImagePipeline` call per prompt (its checkpoint
samples top-1, so both sides write the same tokens; the same seed draws the same latents).

Each reference runs one request at a time on every core; omnistage serves the same prompts through
`AsyncOmni` on the family's default deployment (each stage in its own process). Targets (issue 57): images
per second at concurrency 4 ≥ 2x the reference's; latency at concurrency 1 ≤ 1.1x.

    python benchmarks/hybrid_image.py [--family janus|glm_image] [--requests 4] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omnistage import AsyncOmni, DiffusionParams, SamplingParams  # noqa: E402
from omnistage.families.glm_image.tiny import bench_glm_image_dir  # noqa: E402
from omnistage.families.janus.tiny import bench_janus_dir  # noqa: E402

GLM_STEPS, GLM_SEED = 8, 5

PROMPTS = [
    "a red fox running through the snowy forest at dawn",
    "a bowl of fruit on a wooden table, studio photo",
    "waves crashing on a rocky shore under a stormy sky",
    "a small robot painting a picture of a city skyline",
]


def reference(model_dir: Path, dtype: str):
    """One image as the model card renders it, on the prompt omnistage builds for the same text."""
    from transformers import AutoTokenizer, JanusForConditionalGeneration, JanusImageProcessorPil

    from omnistage.families.janus.decoder import image_prompt, marker_ids
    from omnistage.families.janus.pipeline import to_rgb

    model = JanusForConditionalGeneration.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    processor = JanusImageProcessorPil.from_pretrained(str(model_dir))
    markers = marker_ids(tokenizer, model.generation_config)
    # transformers 5.25 drops the saved image-start id on load
    model.generation_config.generation_kwargs = {"boi_token_id": markers["boi"]}

    def one(text: str) -> np.ndarray:
        ids = torch.tensor([image_prompt(tokenizer, markers, text)[0]])
        with torch.inference_mode():
            tokens = model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_mode="image", do_sample=False
            )
            return to_rgb(model.decode_image_tokens(tokens), processor)[0].numpy()

    return one


def glm_reference(model_dir: Path, dtype: str):
    """One image as `GlmImagePipeline` renders it (256x256, the default omnistage derives: it has none)."""
    from diffusers import GlmImagePipeline

    pipe = GlmImagePipeline.from_pretrained(
        str(model_dir), dtype=getattr(torch, dtype), local_files_only=True
    )
    pipe.set_progress_bar_config(disable=True)

    def one(text: str) -> np.ndarray:
        generator = torch.Generator().manual_seed(GLM_SEED)
        out = pipe(
            text, height=256, width=256, num_inference_steps=GLM_STEPS, generator=generator, output_type="pil"
        )
        return np.asarray(out.images[0])

    return one


FAMILIES = {
    # name: (bench checkpoint, reference, omnistage's per-stage params, the image in words)
    "janus": (bench_janus_dir, reference, [SamplingParams(top_k=1), None], "384x384 (576 tokens)"),
    "glm_image": (
        bench_glm_image_dir,
        glm_reference,
        [SamplingParams(top_k=1), DiffusionParams(num_inference_steps=GLM_STEPS, seed=GLM_SEED)],
        f"256x256 (320 tokens, {GLM_STEPS} steps)",
    ),
}


def run_reference(one, prompts: list[str]) -> dict:
    one(prompts[0])  # warm-up
    times, images = [], []
    for prompt in prompts:
        began = time.perf_counter()
        images.append(one(prompt))
        times.append(time.perf_counter() - began)
    return {
        "latency_p50": statistics.median(times),
        "images_per_s": len(prompts) / sum(times),
        "images": images,
    }


async def run_omnistage(
    model_dir: Path, prompts: list[str], concurrency: int, dtype: str, params: list
) -> dict:
    overrides = {"0": {"max_num_seqs": 2 * concurrency, "dtype": dtype}, "1": {"dtype": dtype}}
    omni = AsyncOmni(str(model_dir), stage_overrides=overrides)

    async def one(prompt: str) -> tuple[float, np.ndarray]:
        began = time.perf_counter()
        async for out in omni.generate(prompt, params, modalities=["image"]):
            if out.finished:
                if out.error is not None:
                    raise RuntimeError(out.error)
                return time.perf_counter() - began, np.asarray(out.images[0])
        raise RuntimeError("no terminal output")

    try:
        await one(prompts[0])  # warm-up
        slots = asyncio.Semaphore(concurrency)

        async def in_a_slot(prompt: str) -> tuple[float, np.ndarray]:
            async with slots:
                return await one(prompt)

        started = time.perf_counter()
        results = await asyncio.gather(*(in_a_slot(p) for p in prompts))
        wall = time.perf_counter() - started
    finally:
        await omni.shutdown()
    return {
        "latency_p50": statistics.median(r[0] for r in results),
        "images_per_s": len(prompts) / wall,
        "images": [r[1] for r in results],
    }


def max_diff(images: list[np.ndarray], others: list[np.ndarray]) -> int:
    return max(int(np.abs(a.astype(int) - b.astype(int)).max()) for a, b in zip(images, others, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--family", choices=tuple(FAMILIES), default="janus")
    parser.add_argument("--requests", type=int, default=4, help="images per side (prompts cycle)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="both sides'")
    args = parser.parse_args()
    started = time.perf_counter()
    checkpoint, make_reference, params, shape = FAMILIES[args.family]
    model_dir = checkpoint(args.dtype)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.requests)]
    print(
        f"{args.family} bench checkpoint {model_dir} (ready in {time.perf_counter() - started:.0f} s): "
        f"{args.requests} images of {shape}; {args.dtype}; {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    torch.set_num_threads(os.cpu_count() or 1)  # the reference on every core
    ref = run_reference(make_reference(model_dir, args.dtype), prompts)
    print(f"reference, one at a time: latency p50 {ref['latency_p50']:.2f} s", flush=True)
    solo = asyncio.run(run_omnistage(model_dir, prompts, 1, args.dtype, params))
    print(f"omnistage c=1: latency p50 {solo['latency_p50']:.2f} s", flush=True)
    many = asyncio.run(run_omnistage(model_dir, prompts, 4, args.dtype, params))
    print(f"\n{'':28} {'latency p50 s':>14} {'images/s':>9}")
    for name, row in (("reference, one at a time", ref), ("omnistage, c=1", solo), ("omnistage, c=4", many)):
        print(f"{name:28} {row['latency_p50']:14.2f} {row['images_per_s']:9.4f}")
    print(
        f"\nlatency c=1 / reference: {solo['latency_p50'] / ref['latency_p50']:.3f}x (target <= 1.1x)\n"
        f"images per second c=4 / reference: {many['images_per_s'] / ref['images_per_s']:.2f}x "
        "(target >= 2x)\n"
        f"pixels max |omnistage - reference| (0-255): c=1 {max_diff(solo['images'], ref['images'])}, "
        f"c=4 {max_diff(many['images'], ref['images'])}; load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
