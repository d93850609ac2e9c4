"""Run a real omnistage server process on the toy pipelines (what `omnistage serve` does for model dirs).

python -m tests.support.launch --port 8123 --models toy-omni,toy-image [--api-key K] [--storage-dir D]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import signal

from omnistage.serving.cli_args import add_server_args, settings_from_args
from omnistage.serving.server import serve
from tests.support.toy_pipelines import PIPELINES


def main() -> None:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    parser.add_argument("--models", required=True, help="comma-separated toy pipeline names")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--placement", default="inline")
    parser.add_argument("--stage-overrides", default=None, help="JSON, applied to every model")
    parser.add_argument("--toy-gate-dir", default=None, help="where tests open the toy engines' gates")
    args = parser.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # what ServerProcess.diagnostics() asks for
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    names = args.models.split(",")
    specs = [PIPELINES[name](gate_dir=args.toy_gate_dir) for name in names]
    omni_kwargs = {"placement": args.placement, "max_queued_requests": args.max_queued_requests}
    if args.stage_overrides:
        omni_kwargs["stage_overrides"] = json.loads(args.stage_overrides)
    serve(
        specs,
        settings_from_args(args),
        host=args.host,
        served_model_names=names,
        port=args.port,
        omni_kwargs=omni_kwargs,
        log_level=args.log_level,
    )


if __name__ == "__main__":
    main()
