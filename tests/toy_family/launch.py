"""`python -m tests.toy_family.launch --port P`: the toy family's pipelines on a real server, over their tiny
checkpoints, every stage in its own process (each registers the family itself, from `PipelineSpec.family`)."""

from __future__ import annotations

import argparse

from omnistage.families.llm.tiny import tiny_llm_dir
from omnistage.serving.cli_args import add_server_args, settings_from_args
from omnistage.serving.server import serve
from tests.toy_family.diffusion import toy_sd_dir
from tests.toy_family.pipeline import TOY_SD, TOY_SPEAKER


def main() -> None:
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    args = parser.parse_args()
    models = [(TOY_SPEAKER, str(tiny_llm_dir("llama"))), (TOY_SD, str(toy_sd_dir()))]
    serve(
        models,
        settings_from_args(args),
        host=args.host,
        port=args.port,
        served_model_names=["toy-speaker", "toy-sd"],
        log_level="warning",
    )


if __name__ == "__main__":
    main()
