"""Typed engine_args (stages/engine_args.py): a misspelled, mistyped or unloadable argument fails the start
with a message naming the key, the stage and the key meant; a family's own arguments extend the engine's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omnistage.config.deploy import resolve_deploy
from omnistage.errors import ConfigError
from omnistage.families.hibari.pipeline import HIBARI_TTS
from omnistage.families.llm.pipeline import LLM_PIPELINE
from omnistage.families.llm.tiny import tiny_llm_dir
from omnistage.stages.engine_args import check_engine_args
from tests.support.server_process import REPO

pytestmark = pytest.mark.unit


def check(pipeline, engine_args: dict) -> None:
    deploy = resolve_deploy(pipeline, None, stage_overrides={"0": {"engine_args": engine_args}})
    check_engine_args(pipeline.stage(0), deploy.stage(0).engine_args)


def test_a_misspelled_engine_argument_names_the_key_the_stage_and_the_one_meant() -> None:
    with pytest.raises(
        ConfigError, match=r"stage 0 \(llm\): unknown key 'block_sise'; did you mean 'block_size'"
    ):
        check(LLM_PIPELINE, {"block_sise": 32})
    check(LLM_PIPELINE, {"block_size": 32, "enable_prefix_caching": False, "cpu_fast_path": False})


@pytest.mark.parametrize(
    "args,field",
    [
        ({"block_size": "big"}, "block_size"),
        ({"scheduling_policy": "random"}, "scheduling_policy"),
        ({"enable_prefix_caching": [1]}, "enable_prefix_caching"),
    ],
)
def test_a_mistyped_engine_argument_names_itself(args: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"stage 0 \(llm\).*{field}"):
        check(LLM_PIPELINE, args)


def test_a_function_that_does_not_load_fails_at_start() -> None:
    with pytest.raises(ConfigError, match=r"model_loader = 'nowhere.at_all:load' does not load"):
        check(LLM_PIPELINE, {"model_loader": "nowhere.at_all:load"})
    not_a_function = "omnistage.stages.ar.cpu.native:SWITCH"
    with pytest.raises(ConfigError, match=rf"post_sample_hook = '{not_a_function}' is not a function"):
        check(LLM_PIPELINE, {"post_sample_hook": not_a_function})


def test_a_familys_own_arguments_are_typed_too() -> None:
    """The voice stage's engine (the hibari family's) declares `threads`, `synthesis`, ..."""
    check(HIBARI_TTS, {"threads": 2, "synthesis": "fast"})
    with pytest.raises(ConfigError, match=r"stage 0 \(voice\): unknown key 'thread'; did you mean 'threads'"):
        check(HIBARI_TTS, {"thread": 2})
    with pytest.raises(ConfigError, match=r"synthesis"):
        check(HIBARI_TTS, {"synthesis": "fastest"})


def test_serve_with_a_misspelled_deploy_key_exits_naming_it(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.yaml"
    deploy.write_text("stages:\n  - stage_id: 0\n    max_num_seq: 4\n")
    command = [sys.executable, "-m", "omnistage", "serve", str(tiny_llm_dir("qwen2")), "--deploy-config"]
    done = subprocess.run([*command, str(deploy)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "omnistage serve: unknown key 'max_num_seq' in stages[0] (stage 0)" in done.stderr
    assert "did you mean 'max_num_seqs'?" in done.stderr
