"""The procedural dataset and the pixel measurements the evaluation relies on."""

import random

import numpy as np
import pytest

from omnistage.demo import measure, render, scenes
from omnistage.demo.architecture import build_tokenizer
from omnistage.demo.dataset import clip_scenes, image_scenes, pixels

pytestmark = pytest.mark.unit


def test_batches_are_a_pure_function_of_seed_and_index():
    first, again = image_scenes(3, 5, 8), image_scenes(3, 5, 8)
    assert [s.caption for s in first] == [s.caption for s in again]
    assert np.array_equal(pixels(first).numpy(), pixels(again).numpy())
    assert [s.caption for s in image_scenes(3, 6, 8)] != [s.caption for s in first]


def test_training_never_shows_held_out_combinations():
    placements, motions = scenes.held_out_placements(), scenes.held_out_motions()
    assert placements and motions
    for scene in image_scenes(0, 0, 400):
        if len(scene.shapes) == 1:
            shape = scene.shapes[0]
            assert (shape.colour, shape.kind, scene.position) not in placements
    for scene in clip_scenes(0, 0, 200):
        shape = scene.shapes[0]
        assert (shape.colour, shape.kind, scene.direction) not in motions
    held_out_captions = {s.caption for s in scenes.evaluation_image_scenes()}
    assert len(held_out_captions) == len(placements)


def test_captions_and_frames():
    clip = scenes.motion_scene("red", "circle", "right", "blue", random.Random(0))
    assert clip.caption.startswith("a red circle moving right")
    frames = render.render(clip)
    assert frames.shape == (scenes.CLIP_FRAMES, scenes.SIZE, scenes.SIZE, 3) and frames.dtype == np.uint8
    assert render.render(scenes.evaluation_image_scenes()[0]).shape == (1, scenes.SIZE, scenes.SIZE, 3)


def test_measurement_reads_ground_truth():
    rng, hits, total = random.Random(1), {"colour": 0, "shape": 0, "position": 0}, 0
    for _ in range(150):
        scene = scenes.sample_image_scene(rng, set())
        if len(scene.shapes) > 1:
            continue
        seen, truth, total = measure.measure_frame(render.render(scene)[0]), scene.shapes[0], total + 1
        hits["colour"] += seen.colour == truth.colour
        hits["shape"] += seen.shape == truth.kind
        hits["position"] += seen.position == scene.position
    assert hits["colour"] == total
    assert hits["shape"] >= 0.97 * total and hits["position"] >= 0.97 * total
    for direction in scenes.DIRECTIONS:
        clip = scenes.motion_scene("yellow", "square", direction, "gray", rng)
        assert measure.motion_of(render.render(clip)) == direction


def test_measurement_of_an_empty_frame():
    blank = np.full((scenes.SIZE, scenes.SIZE, 3), 20, np.uint8)
    assert measure.measure_frame(blank).count == 0
    assert measure.motion_of(np.stack([blank, blank])) == "still"


def test_tokenizer_uses_t5_special_ids():
    tokenizer = build_tokenizer()
    ids = tokenizer("A red circle, on the left!").input_ids
    assert ids[-1] == 1 and 2 not in ids  # </s> appended, no unknown words
    assert tokenizer("").input_ids == [1]
    assert tokenizer("a zebra").input_ids[1] == 2  # unknown word -> <unk>
    assert tokenizer.pad_token_id == 0
