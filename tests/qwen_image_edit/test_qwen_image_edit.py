"""Qwen-Image-Edit step by step (omnistage/families/qwen_image_edit, a tiny checkpoint of diffusers' and
transformers' own classes): each edit equals diffusers' own `QwenImageEditPipeline` call for the same seed
within 1e-4, alone and four at once (images of three shapes, two output sizes, negative prompts under true
CFG, two outputs); an abort between steps frees the slot."""

from __future__ import annotations

import pytest

from omnistage.families.qwen_image_edit.tiny import tiny_qwen_image_edit_dir
from omnistage.stages.diffusion.engine import DiffusionEngine
from tests.diffusion.helpers import (
    all_at_once,
    assert_each_close,
    check_an_abort_frees_the_slot,
    each_alone,
    family_engine,
)
from tests.qwen_image_edit.helpers import BASE, EDIT_CASES, SQUARE, TOLERANCE, forward_rows

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine() -> DiffusionEngine:
    return family_engine(tiny_qwen_image_edit_dir(), step_token_budget=0)  # no per-forward budget: shared


def test_each_edit_equals_the_plain_pipeline_alone_and_four_at_once(
    engine, edit_references, monkeypatch
) -> None:
    assert engine.mode == "step"
    alone = EDIT_CASES[:1]  # with true CFG (each image costs a ~1024x1024 VAE encode: the others run at once)
    assert_each_close(each_alone(engine, alone, BASE), {"a": edit_references["a"]}, TOLERANCE)
    rows = forward_rows(engine, monkeypatch)
    first, got = all_at_once(engine, EDIT_CASES, BASE)
    assert first == {"a", "b", "d"}  # the 64x64 outputs share a step,
    assert sorted(rows[:2]) == [2, 3]  # a's two branches and b in one forward, d's two outputs in another
    assert_each_close(got, edit_references, TOLERANCE)


def test_an_abort_between_steps_frees_the_slot(engine) -> None:
    check_an_abort_frees_the_slot(engine, {**BASE, "image": [SQUARE]})
