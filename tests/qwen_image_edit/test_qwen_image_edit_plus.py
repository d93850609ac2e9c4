"""Qwen-Image-Edit-Plus step by step (omnistage/families/qwen_image_edit, a tiny checkpoint of diffusers' and
transformers' own classes): each edit of one or two images equals diffusers' own `QwenImageEditPlusPipeline`
call for the same seed within 1e-4, alone and three at once (two output sizes, image sets of three shapes,
a negative prompt under true CFG); an abort between steps frees the slot."""

from __future__ import annotations

import pytest

from omnistage.families.qwen_image_edit.tiny import tiny_qwen_image_edit_plus_dir
from omnistage.stages.diffusion.engine import DiffusionEngine
from tests.diffusion.helpers import (
    all_at_once,
    assert_each_close,
    check_an_abort_frees_the_slot,
    each_alone,
    family_engine,
)
from tests.qwen_image_edit.helpers import BASE, PLUS_CASES, TOLERANCE, WIDE, forward_rows

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine() -> DiffusionEngine:
    return family_engine(tiny_qwen_image_edit_plus_dir(), step_token_budget=0)  # no per-forward budget


def test_each_edit_equals_the_plain_pipeline_alone_and_three_at_once(
    engine, plus_references, monkeypatch
) -> None:
    assert engine.mode == "step"
    alone = PLUS_CASES[:1]  # two images and true CFG
    assert_each_close(each_alone(engine, alone, BASE), {"a": plus_references["a"]}, TOLERANCE)
    rows = forward_rows(engine, monkeypatch)
    first, got = all_at_once(engine, PLUS_CASES, BASE)
    assert first == {"a", "b"}  # the 64x64 outputs share a step,
    assert sorted(rows[:2]) == [1, 2]  # in two forwards (a's two branches; b, whose images differ)
    assert_each_close(got, plus_references, TOLERANCE)


def test_an_abort_between_steps_frees_the_slot(engine) -> None:
    check_an_abort_frees_the_slot(engine, {**BASE, "image": [WIDE]})
