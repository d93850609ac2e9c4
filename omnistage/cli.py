"""`omnistage serve | run | demo | bench` and `omnistage --version`."""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from omnistage import __version__
from omnistage.errors import OmniError
from omnistage.serving.cli_args import add_server_args, settings_from_args

logger = logging.getLogger("omnistage")

# CLI flags that set a deploy field on every stage (precedence: above YAML, below --stage-overrides).
STAGE_FLAGS = {
    "placement": str,
    "dtype": str,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "kv_cache_bytes": int,
    "num_threads": int,
    "devices": str,
    "replicas": int,
    "startup_timeout_s": float,
}


def add_deploy_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--deploy-config",
        "--stage-configs-path",  # vLLM-Omni's name for it
        dest="deploy_config",
        help="deploy YAML (default: the pipeline's bundled one)",
    )
    parser.add_argument(
        "--stage-overrides", help='per-stage settings as JSON, e.g. \'{"0": {"max_num_seqs": 4}}\''
    )
    for name, kind in STAGE_FLAGS.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=kind, default=None, help=f"{name} for every stage"
        )
    parser.add_argument(
        "--ray-address",
        help="the Ray cluster that placement-ray stages join: host:port of its head, or auto (the "
        "`ray start` cluster on this host); unset: a new local cluster (docs/multi_host.md)",
    )


def deploy_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    if args.ray_address:  # what ray.init() reads; the orchestrator joins it (runtime/ray_client.py)
        os.environ["RAY_ADDRESS"] = args.ray_address
    flags = {name: getattr(args, name) for name in STAGE_FLAGS if getattr(args, name) is not None}
    return {"deploy_config": args.deploy_config, "stage_overrides": args.stage_overrides, **flags}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omnistage", description=__doc__)
    parser.add_argument("--version", action="version", version=f"omnistage {__version__}")
    parser.add_argument("--log-level", default=os.environ.get("OMNISTAGE_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command")

    serve = sub.add_parser("serve", help="serve models over an OpenAI-compatible HTTP API")
    serve.add_argument("models", nargs="*", help="model directories or cached hub ids (none: the demo set)")
    serve.add_argument("--model", action="append", default=[], help="a model, as vLLM's flag (repeatable)")
    # vLLM-Omni's flags that mean nothing more here: sleep is always available, every model is served as
    # a stage graph
    serve.add_argument(
        "--enable-sleep-mode", action="store_true", help="accepted (sleep is always available)"
    )
    serve.add_argument("--omni", action="store_true", help="accepted and ignored (vLLM-Omni's switch)")
    serve.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help="accepted (tool_choice auto is on for every model that calls tools)",
    )
    add_server_args(serve)
    add_deploy_args(serve)

    run = sub.add_parser("run", help="offline batch generation")
    run.add_argument("model")
    group = run.add_mutually_exclusive_group(required=True)
    group.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    group.add_argument("--prompts-file", help="one prompt per line, or JSON lines with a 'prompt' field")
    run.add_argument("--output-dir", required=True)
    run.add_argument("--modalities", help="comma-separated output modalities (default: the pipeline's)")
    run.add_argument("--params", help="JSON object of parameters for the first stage")
    add_deploy_args(run)

    bench = sub.add_parser("bench", help="measure a running server").add_subparsers(dest="bench_command")
    from omnistage.bench.serve import add_args as add_bench_serve_args

    add_bench_serve_args(bench.add_parser("serve", help="load an OpenAI-compatible server, report figures"))

    demo = sub.add_parser("demo", help="build or train the embedded demo models")
    demo.add_argument("action", choices=["build", "train"])
    demo.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "serve":
        # `kill -USR1 <pid>`: every thread's stack on stderr (a server that seems stuck says where).
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        return _serve(args)
    if args.command == "run":
        return _run(args)
    if args.command == "demo":
        return _demo(args)
    if args.command == "bench" and args.bench_command == "serve":
        from omnistage.bench.serve import main as bench_serve

        return bench_serve(args)
    parser.print_help()
    return 2


def _serve(args: argparse.Namespace) -> int:
    from omnistage.serving.server import serve

    models = [*args.models, *args.model]
    if not models:
        from omnistage.demo import demo_model_dirs

        models = [str(p) for p in demo_model_dirs()]
        logger.info("serving the demo set: %s", ", ".join(models))
    names = args.served_model_name
    if names is not None and len(names) != len(models):
        raise SystemExit(f"--served-model-name gives {len(names)} names for {len(models)} models")
    try:
        serve(
            models,
            settings_from_args(args),
            host=args.host,
            port=args.port,
            served_model_names=names,
            omni_kwargs={**deploy_kwargs(args), "max_queued_requests": args.max_queued_requests},
            log_level=args.log_level.lower(),
        )
    except OmniError as exc:  # a model that cannot start (config, a stage that fails or is late): say why
        print(f"omnistage serve: {exc.message}", file=sys.stderr)
        return 1
    return 0


def _read_prompts(args: argparse.Namespace) -> list[Any]:
    if args.prompt:
        return list(args.prompt)
    prompts = []
    for line in Path(args.prompts_file).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            record = json.loads(line)
            prompts.append(record.get("prompt", record))
        else:
            prompts.append(line)
    return prompts


def _run(args: argparse.Namespace) -> int:
    from omnistage.api import Omni

    prompts = _read_prompts(args)
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    modalities = args.modalities.split(",") if args.modalities else None
    with Omni(args.model, **deploy_kwargs(args)) as omni:
        params = None
        if args.params:
            stage = next(s for s in omni.pipeline.stages if not s.inputs)
            from omnistage.params import params_class

            params = params_class(stage.kind)(**json.loads(args.params))
        outputs = omni.generate(prompts, params, modalities=modalities)
    failed = 0
    with open(out_dir / "results.jsonl", "w") as summary:
        for i, out in enumerate(outputs):
            record = save_output(out, out_dir, f"{i:04d}")
            failed += out.error is not None
            summary.write(json.dumps(record) + "\n")
    print(f"wrote {len(outputs)} results to {out_dir} ({failed} failed)")
    return 1 if failed else 0


def save_output(out: Any, out_dir: Path, stem: str) -> dict[str, Any]:
    """Write one result's media next to a JSON record of it."""
    record: dict[str, Any] = {
        "request_id": out.request_id,
        "finish_reason": out.finish_reason,
        "text": out.text,
        "usage": out.usage,
        "files": [],
    }
    if out.error is not None:
        record["error"] = str(out.error)
    if out.text:
        (out_dir / f"{stem}.txt").write_text(out.text)
        record["files"].append(f"{stem}.txt")
    if out.audio is not None:
        import soundfile

        soundfile.write(out_dir / f"{stem}.wav", out.audio.float().numpy(), out.sample_rate or 24000)
        record["files"].append(f"{stem}.wav")
    for k, image in enumerate(out.images):
        image.save(out_dir / f"{stem}_{k}.png")
        record["files"].append(f"{stem}_{k}.png")
    if out.video is not None:
        from omnistage.media import encode_video
        from omnistage.serving.routes.videos import soundtrack_of

        for k, clip in enumerate(out.video if out.video.ndim == 5 else out.video[None]):
            mp4 = encode_video(clip, out.fps or 16, **soundtrack_of(out, k))
            (out_dir / f"{stem}_{k}.mp4").write_bytes(mp4)
            record["files"].append(f"{stem}_{k}.mp4")
    return record


def _demo(args: argparse.Namespace) -> int:
    from omnistage import demo

    if args.action == "build":
        for path in demo.demo_model_dirs():
            print(path)
        return 0
    return demo.train(args.rest)


if __name__ == "__main__":
    sys.exit(main())
