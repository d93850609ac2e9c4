"""Diffusion serving per family (issue 58): the step-wise families against their plain diffusers call.

`python benchmarks/diffusion_serving.py --family NAME` runs these two sections on one family's tiny
checkpoint (the one its equality tests use; Stable Audio's bench-sized one), with requests sized by the
table below so a request is mostly the model's arithmetic:

  1. overhead at concurrency 1: one request at a time, the plain `pipe(...)` call (exactly the call request
     mode makes: the adapter's `call_kwargs`) against the engine in step mode, interleaved, same seeds;
  3. short requests behind a long one: one long request, then short ones arriving while it runs; p50 latency
     of the short ones when whole calls run first come, first served (the plain pipeline) against step mode.

Families: z_image, flux2 (Klein, an edit), qwen_image_edit, hunyuan_video15, ltx2, stable_audio.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from omnistage.config.deploy import StageDeploy
from omnistage.families import registry
from omnistage.params import DiffusionParams
from omnistage.stages.base import StageRequest
from omnistage.stages.diffusion.engine import DiffusionEngine

PROMPTS = [
    "a red fox running through the snowy forest at dawn",
    "waves crashing on a rocky shore under a stormy sky",
    "a small robot painting a picture of a city skyline",
    "an astronaut riding a horse on the moon",
    "a bowl of fruit on a wooden table",
    "a watercolor painting of mountains and a quiet lake",
    "a cat sitting on a bench in the sun",
    "the quick brown fox jumps over the lazy dog",
]


@dataclasses.dataclass
class Family:
    """A family's checkpoint and request shapes: `base` for the overhead section, `long` / `short` for the
    short-behind-long one (each on top of `base`); `edits`: requests carry an input image."""

    directory: Callable[[], Path]
    base: dict[str, Any]
    long: dict[str, Any]
    short: dict[str, Any]
    edits: bool = False


def _dir(module: str, name: str, *args: Any) -> Callable[[], Path]:
    def build() -> Path:
        import importlib

        return getattr(importlib.import_module(module), name)(*args)

    return build


FAMILIES = {
    "z_image": Family(
        _dir("omnistage.families.z_image.tiny", "tiny_z_image_dir"),
        # 4 images a request: the tiny model's forward is a few ms, and its rotary table ends at 32 patches
        {"height": 256, "width": 256, "num_inference_steps": 8, "num_outputs": 4},
        {"num_inference_steps": 32},
        {"height": 128, "width": 128, "num_outputs": 1},
    ),
    "flux2": Family(
        _dir("omnistage.families.flux2.tiny", "tiny_flux2_klein_dir"),
        {"height": 256, "width": 256, "num_inference_steps": 8},
        {"height": 448, "width": 448, "num_inference_steps": 32},
        {"height": 128, "width": 128},
        edits=True,
    ),
    "qwen_image_edit": Family(
        _dir("omnistage.families.qwen_image_edit.tiny", "tiny_qwen_image_edit_dir"),
        {"height": 256, "width": 256, "num_inference_steps": 8},
        {"height": 448, "width": 448, "num_inference_steps": 16},
        {"height": 128, "width": 128},
        edits=True,
    ),
    "hunyuan_video15": Family(
        _dir("omnistage.families.hunyuan_video15.tiny", "tiny_hunyuan_video15_dir"),
        {"height": 64, "width": 64, "num_frames": 9, "num_inference_steps": 8},
        {"height": 128, "width": 128, "num_frames": 17, "num_inference_steps": 8},
        {"height": 32, "width": 32, "num_frames": 5},
    ),
    "ltx2": Family(
        _dir("omnistage.families.ltx2.tiny", "tiny_ltx2_dir"),
        {"height": 64, "width": 64, "num_frames": 9, "num_inference_steps": 8},
        {"height": 128, "width": 128, "num_frames": 17, "num_inference_steps": 8},
        {"height": 32, "width": 32, "num_frames": 9},
    ),
    "stable_audio": Family(
        _dir("omnistage.families.diffusers.tiny", "stable_audio_bench_dir"),  # 1024 latent frames
        {"num_inference_steps": 16},
        {"num_inference_steps": 64},
        {"num_inference_steps": 8},
    ),
}


def input_image(seed: int, size: int = 96) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def job(i: int, arrival: float, fields: dict[str, Any], edits: bool) -> dict[str, Any]:
    params = {**fields, "seed": 1000 + i, "output_format": "tensor"}
    if edits:
        params["image"] = [input_image(i)]
    return {"id": f"r{i}", "arrival": arrival, "prompt": PROMPTS[i % len(PROMPTS)], "params": params}


def make_engine(directory: Path, threads: int, max_num_seqs: int, **engine_args: Any) -> DiffusionEngine:
    registry.load()
    deploy = StageDeploy(stage_id=0, max_num_seqs=max_num_seqs, dtype="float32", num_threads=threads)
    return DiffusionEngine(str(directory), deploy, engine_args={"execution": "step", **engine_args})


def plain_pipeline(directory: Path) -> Any:
    from diffusers import DiffusionPipeline

    registry.load()  # a family's own components (e.g. an image-only processor) import first
    pipe = DiffusionPipeline.from_pretrained(str(directory), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_plain(pipe: Any, engine: DiffusionEngine, jobs: list[dict]) -> dict[str, dict]:
    """Whole plain calls in arrival order. Each call's arguments are the ones request mode passes
    (`adapter.call_kwargs` of the request as the engine parses it), so plain and step mode get one request."""
    start, results = time.monotonic(), {}
    for j in sorted(jobs, key=lambda j: j["arrival"]):
        kwargs = engine.adapter.call_kwargs([engine._parse(_request(j, start))])  # noqa: SLF001
        wait = start + j["arrival"] - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        pipe(**kwargs)
        finish = time.monotonic() - start
        results[j["id"]] = {"latency": finish - j["arrival"], "finish": finish}
    return results


def _request(j: dict, start: float, extra: dict | None = None) -> StageRequest:
    params = DiffusionParams(**{**j["params"], **(extra or {})})
    return StageRequest(j["id"], prompt=j["prompt"], params=params, arrival_time=start + j["arrival"])


def run_engine(engine: DiffusionEngine, jobs: list[dict], extra: dict | None = None) -> dict[str, dict]:
    """The engine driven as the stage worker drives it: each job added once its arrival time has passed
    (`extra`: fields over every job's), `step()` while there is work. Per job: latency (finish - arrival),
    finish, output (frames or images), metrics."""
    pending = sorted(jobs, key=lambda j: j["arrival"])
    start, results = time.monotonic(), {}
    while pending or engine.has_work():
        now = time.monotonic() - start
        while pending and pending[0]["arrival"] <= now:
            engine.add_request(_request(pending.pop(0), start, extra))
        if not engine.has_work():
            time.sleep(max(0.0, pending[0]["arrival"] - now))
            continue
        for out in engine.step():
            if out.finished:
                if out.error:
                    raise RuntimeError(f"{out.request_id}: {out.error}")
                finish = time.monotonic() - start
                arrival = next(j["arrival"] for j in jobs if j["id"] == out.request_id)
                media = out.video if out.video is not None else out.images
                results[out.request_id] = {
                    "latency": finish - arrival,
                    "finish": finish,
                    "output": None if media is None else media.numpy(),
                    "metrics": out.metrics,
                }
    return results


def overhead(name: str, repeats: int, threads: int, log: Callable[[str], None]) -> dict:
    family = FAMILIES[name]
    directory = family.directory()
    pipe, engine = plain_pipeline(directory), make_engine(directory, threads, 1)
    jobs = [job(i, 0.0, family.base, family.edits) for i in range(repeats + 1)]
    run_plain(pipe, engine, jobs[:1]), run_engine(engine, jobs[:1])  # warm-up, untimed
    times: dict[str, list[float]] = {"plain": [], "step": []}
    for j in jobs[1:]:  # interleaved so load drift hits both alike
        times["plain"].append(run_plain(pipe, engine, [j])[j["id"]]["latency"])
        times["step"].append(run_engine(engine, [j])[j["id"]]["latency"])
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = 100 * (med["step"] / med["plain"] - 1)
    log(
        f"  [{name}] {family.base}: step {med['step']:.3f} s vs plain {med['plain']:.3f} s: "
        f"overhead {ratio:+.2f}%"
    )
    return {"median_s": med, "all_s": times, "overhead_pct": ratio}


def short_latency(name: str, shorts: int, threads: int, log: Callable[[str], None]) -> dict:
    family = FAMILIES[name]
    directory = family.directory()
    pipe, engine = plain_pipeline(directory), make_engine(directory, threads, 8)
    long_fields, short_fields = {**family.base, **family.long}, {**family.base, **family.short}
    probe = [job(99, 0.0, short_fields, family.edits)]
    run_plain(pipe, engine, probe), run_engine(engine, probe)  # warm-up, untimed
    short_s = run_plain(pipe, engine, probe)[probe[0]["id"]]["latency"]
    # The short requests arrive one short service time apart, from one such time after the long one.
    jobs = [job(0, 0.0, long_fields, family.edits)]
    jobs += [job(i, i * short_s, short_fields, family.edits) for i in range(1, shorts + 1)]
    ids = [j["id"] for j in jobs[1:]]
    fcfs = run_plain(pipe, engine, jobs)
    step = run_engine(engine, jobs)
    p50 = {
        k: float(np.percentile([r[i]["latency"] for i in ids], 50))
        for k, r in (("fcfs", fcfs), ("step", step))
    }
    better = p50["fcfs"] / p50["step"]
    log(
        f"  [{name}] 1 long {family.long} + {shorts} short {family.short}: "
        f"short p50 FCFS {p50['fcfs']:.2f} s, "
        f"step {p50['step']:.2f} s: {better:.2f}x better; the long one FCFS {fcfs['r0']['latency']:.2f} s, "
        f"step {step['r0']['latency']:.2f} s"
    )
    return {"p50_s": p50, "improvement": better, "short_service_s": short_s}
