"""The command line: version, argument errors, and the deploy flags it turns into overrides."""

import subprocess
import sys

import pytest

from omnistage import __version__
from omnistage.cli import build_parser, deploy_kwargs

pytestmark = pytest.mark.unit


def test_version():
    done = subprocess.run([sys.executable, "-m", "omnistage", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"omnistage {__version__}"


def test_deploy_flags_become_overrides():
    args = build_parser().parse_args(
        [
            "serve",
            "m",
            "--max-num-seqs",
            "4",
            "--placement",
            "inline",
            "--stage-overrides",
            '{"0": {"dtype": "float32"}}',
        ]
    )
    kwargs = deploy_kwargs(args)
    assert kwargs["max_num_seqs"] == 4 and kwargs["placement"] == "inline"
    assert kwargs["stage_overrides"] == '{"0": {"dtype": "float32"}}' and kwargs["deploy_config"] is None
    assert "dtype" not in kwargs


def test_run_needs_prompts_and_output_dir():
    done = subprocess.run([sys.executable, "-m", "omnistage", "run", "m"], capture_output=True, text=True)
    assert done.returncode == 2 and "--prompt" in done.stderr


def test_vllm_omni_serve_flags_are_accepted():
    """The flags vLLM-Omni users type: `--stage-configs-path` is the deploy YAML, `--model` adds a model,
    `--enable-sleep-mode` and `--omni` are accepted (sleep is always available; every model is a graph)."""
    args = build_parser().parse_args(
        [
            "serve",
            "--model",
            "org/name",
            "--stage-configs-path",
            "deploy.yaml",
            "--enable-sleep-mode",
            "--omni",
        ]
    )
    assert args.model == ["org/name"] and args.models == []
    assert deploy_kwargs(args)["deploy_config"] == "deploy.yaml"
    assert args.enable_sleep_mode and args.omni
