"""`omnistage demo train` / `python -m omnistage.demo.trainer`: reproduces the demo model from nothing.

Phases, each resumable (state and a log live in --workdir; rerunning the same command continues):
  vae      train the Wan VAE on rendered scenes (fresh scenes every step)
  latents  record the latent statistics in the VAE config, encode the DiT's training set once
  dit      train the DiT and text encoder with flow matching (EMA weights are exported)
  export   write the diffusers pipeline directory (--output)
  eval     score held-out captions (colour, shape, position, motion) and cache-dit behaviour

Run it niced on a shared machine: `nice -n 19 omnistage demo train --threads 2`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch

from omnistage.cache import cache_root
from omnistage.demo import architecture
from omnistage.demo.dit_training import DitTraining, Ema, encode_latent_sets, train_dit
from omnistage.demo.vae_training import VaeTraining, latent_statistics, train_vae

logger = logging.getLogger("omnistage.demo.trainer")  # also when run as __main__

PHASES = ("vae", "latents", "dit", "export", "eval")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="omnistage demo train", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workdir",
        type=Path,
        default=cache_root() / "demo-train",
        help="training state, latents and train.log (resume by rerunning)",
    )
    parser.add_argument(
        "--output", type=Path, default=None, help="pipeline directory to write (default: WORKDIR/pipeline)"
    )
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}"
    )
    parser.add_argument("--vae-steps", type=int, default=VaeTraining.steps)
    parser.add_argument("--dit-steps", type=int, default=DitTraining.steps)
    parser.add_argument(
        "--dit-batch",
        type=int,
        nargs=2,
        metavar=("IMAGES", "CLIPS"),
        default=(DitTraining.images_per_step, DitTraining.clips_per_step),
        help="still images and clips per DiT step (smaller: more updates per CPU-second)",
    )
    parser.add_argument(
        "--dit-stop-at", type=int, default=None, help="stop the DiT at this step (schedule: --dit-steps)"
    )
    parser.add_argument("--dit-checkpoint-every", type=int, default=DitTraining.checkpoint_every)
    parser.add_argument("--probe-every", type=int, default=500, help="score held-out captions every N steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="test-scale model and data (seconds, not hours)")
    return parser.parse_args(argv)


def configure_logging(workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(workdir / "train.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    root = logging.getLogger("omnistage")
    root.addHandler(handler)
    root.setLevel(logging.INFO)


@dataclasses.dataclass
class Components:
    """The pipeline's parts while they train; `build` seeds them so a rerun starts from the same weights."""

    tokenizer: object
    text_encoder: torch.nn.Module
    vae: torch.nn.Module
    transformer: torch.nn.Module
    scheduler: object

    @classmethod
    def build(cls, arch: architecture.DemoArchitecture, seed: int) -> Components:
        torch.manual_seed(seed)
        tokenizer = architecture.build_tokenizer()
        return cls(
            tokenizer,
            architecture.build_text_encoder(arch, len(tokenizer)),
            architecture.build_vae(arch),
            architecture.build_transformer(arch),
            architecture.build_scheduler(arch),
        )


def run_vae(parts: Components, config: VaeTraining, workdir: Path) -> None:
    """Trains the VAE (or loads the finished one) and records its latent statistics."""
    finished = workdir / "vae_trained.pt"
    if finished.exists():
        parts.vae.load_state_dict(torch.load(finished, weights_only=True))
    else:
        train_vae(parts.vae, config, workdir)
        torch.save(parts.vae.state_dict(), finished)
    parts.vae.eval()
    stats = workdir / "latent_stats.json"
    if not stats.exists():
        mean, std = latent_statistics(parts.vae, config.seed)
        stats.write_text(json.dumps({"mean": mean, "std": std}))
    recorded = json.loads(stats.read_text())
    architecture.with_latent_stats(parts.vae, recorded["mean"], recorded["std"])


def export(parts: Components, ema: Ema, output: Path) -> Path:
    parts.transformer.load_state_dict(ema.shadow["transformer"].state_dict())
    parts.text_encoder.load_state_dict(ema.shadow["text_encoder"].state_dict())
    pipe = architecture.assemble_pipeline(
        parts.tokenizer,
        parts.text_encoder.eval(),
        parts.vae.eval(),
        parts.transformer.eval(),
        parts.scheduler,
    )
    architecture.save_pipeline(pipe, output)
    logger.info("wrote pipeline to %s", output)
    return output


def configs(args: argparse.Namespace) -> tuple[architecture.DemoArchitecture, VaeTraining, DitTraining]:
    arch = architecture.DemoArchitecture.tiny() if args.tiny else architecture.DemoArchitecture()
    vae = VaeTraining(steps=args.vae_steps, seed=args.seed)
    dit = DitTraining(
        steps=args.dit_steps,
        seed=args.seed,
        flow_shift=arch.flow_shift,
        images_per_step=args.dit_batch[0],
        clips_per_step=args.dit_batch[1],
        checkpoint_every=args.dit_checkpoint_every,
        stop_at=args.dit_stop_at,
    )
    if args.tiny:
        vae = dataclasses.replace(vae, images_per_step=2, clips_per_step=1, warmup=1, checkpoint_every=2)
        dit = dataclasses.replace(
            dit,
            images_per_step=4,
            clips_per_step=2,
            warmup=1,
            checkpoint_every=2,
            dataset_images=8,
            dataset_clips=4,
            encode_batch=8,
        )
    return arch, vae, dit


def progress_probe(parts: Components, every: int) -> Callable[[int, Ema], None]:
    """Scores the EMA weights on held-out captions every `every` steps (20 steps, 1 seed: ~a minute),
    so a long run shows in its log whether it is learning."""
    from omnistage.demo.evaluate import quality_report

    def probe(step: int, ema: Ema) -> None:
        if step % every:
            return
        pipe = architecture.assemble_pipeline(
            parts.tokenizer, ema.shadow["text_encoder"], parts.vae, ema.shadow["transformer"], parts.scheduler
        )
        with torch.no_grad():
            logger.info("probe at step %d: %s", step, json.dumps(quality_report(pipe, seeds=1, steps=20)))

    return probe


def trained_ema(parts: Components, config: DitTraining, workdir: Path) -> Ema:
    """The EMA weights of the last DiT checkpoint (what `export` writes when `dit` is not rerun)."""
    modules = {"transformer": parts.transformer, "text_encoder": parts.text_encoder}
    ema = Ema(modules, config.ema_decay)
    state_path = workdir / "dit_state.pt"
    if not state_path.exists():
        raise SystemExit(f"no DiT checkpoint at {state_path}: run the 'dit' phase first")
    ema.load_state_dict(torch.load(state_path, weights_only=False)["ema"])
    return ema


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"--phases: unknown phase(s) {unknown}; choose from {list(PHASES)}")
    torch.set_num_threads(args.threads)
    configure_logging(args.workdir)
    output = args.output or args.workdir / "pipeline"
    arch, vae_config, dit_config = configs(args)
    started = time.time()
    logger.info("demo train: phases %s, workdir %s, %s", phases, args.workdir, arch)
    parts = Components.build(arch, args.seed)
    if set(phases) & {"vae", "latents", "dit", "export"}:
        run_vae(parts, vae_config, args.workdir)  # trains, resumes, or loads the finished VAE
    if set(phases) & {"latents", "dit"}:
        data = encode_latent_sets(parts.vae, dit_config, args.workdir / "latents.pt")
    if "dit" in phases:
        probe = progress_probe(parts, args.probe_every) if args.probe_every else None
        text = (parts.text_encoder, parts.tokenizer)
        train_dit(parts.transformer, *text, data, dit_config, args.workdir, probe)
    if "export" in phases:
        export(parts, trained_ema(parts, dit_config, args.workdir), output)
    logger.info("demo train: phases done in %.1f min", (time.time() - started) / 60)
    if "eval" in phases:
        return run_eval(output, args)
    return 0


def run_eval(output: Path, args: argparse.Namespace) -> int:
    from omnistage.demo.evaluate import evaluate_pipeline_dir

    report = evaluate_pipeline_dir(output, quick=args.tiny)
    (args.workdir / "eval.json").write_text(json.dumps(report, indent=2))
    logger.info("evaluation: %s", json.dumps(report))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
