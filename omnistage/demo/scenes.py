"""The demo model's world: captioned scenes of flat shapes, drawn from a seed.

Everything the demo model knows comes from here, so the vocabulary is small and every caption word maps
to something measurable on the pixels (colour, shape, count, position, motion). A fixed set of
(colour, shape, position) and (colour, shape, direction) combinations never appears in training; the
evaluation captions are exactly those, so a good score means the model composes words it has seen apart.
"""

from __future__ import annotations

import dataclasses
import random

from omnistage.families.wan.shapes import CLIP_FRAMES, SIZE

CLIP_TRAVEL = 16.0  # pixels a moving shape travels from the first to the last frame

# RGB values; background colours are darker or lighter variants so a shape never hides in the background.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (225, 45, 45),
    "green": (50, 185, 70),
    "blue": (55, 95, 235),
    "yellow": (240, 215, 50),
    "purple": (150, 70, 205),
    "white": (240, 240, 240),
}
BACKGROUNDS: dict[str, tuple[int, int, int]] = {
    "black": (20, 20, 20),
    "gray": (110, 110, 110),
    "white": (235, 235, 235),
    "blue": (35, 55, 150),
}
SHAPES = ("circle", "square", "triangle")
# Position name -> centre as fractions of the canvas (a 3x3 grid).
POSITIONS: dict[str, tuple[float, float]] = {
    "top left": (0.25, 0.25),
    "top": (0.5, 0.25),
    "top right": (0.75, 0.25),
    "left": (0.25, 0.5),
    "center": (0.5, 0.5),
    "right": (0.75, 0.5),
    "bottom left": (0.25, 0.75),
    "bottom": (0.5, 0.75),
    "bottom right": (0.75, 0.75),
}
POSITION_PHRASES = {
    "center": "in the center",
    "left": "on the left",
    "right": "on the right",
    "top": "at the top",
    "bottom": "at the bottom",
}
DIRECTIONS: dict[str, tuple[float, float]] = {
    "left": (-1.0, 0.0),
    "right": (1.0, 0.0),
    "up": (0.0, -1.0),
    "down": (0.0, 1.0),
}
COUNT_WORDS = {1: "a", 2: "two", 3: "three"}

HELD_OUT_SEED = 7
HELD_OUT_FRACTION = 0.15


@dataclasses.dataclass(frozen=True)
class Shape:
    """One shape: its kind, colour name, centre (pixels) and half-size (pixels)."""

    kind: str
    colour: str
    x: float
    y: float
    radius: float


@dataclasses.dataclass(frozen=True)
class Scene:
    """What one training sample shows; `direction` is set for clips only."""

    shapes: tuple[Shape, ...]
    background: str
    position: str | None = None  # named grid cell of a single shape
    direction: str | None = None
    show_position: bool = True
    show_background: bool = True

    @property
    def num_frames(self) -> int:
        return CLIP_FRAMES if self.direction else 1

    @property
    def caption(self) -> str:
        return caption(self)


def position_phrase(position: str) -> str:
    return POSITION_PHRASES.get(position, f"at the {position}")


def caption(scene: Scene) -> str:
    """The English description of a scene, e.g. 'two yellow squares on a gray background'."""
    first = scene.shapes[0]
    count = len(scene.shapes)
    noun = first.kind + ("s" if count > 1 else "")
    words = [COUNT_WORDS[count], first.colour, noun]
    if scene.direction:
        words.append(f"moving {scene.direction}")
    elif scene.position and scene.show_position:
        words.append(position_phrase(scene.position))
    if scene.show_background:
        words.append(f"on a {scene.background} background")
    return " ".join(words)


def vocabulary() -> list[str]:
    """Every word a caption can contain, in a fixed order (the tokenizer's word list)."""
    words: list[str] = []
    phrases = [*COUNT_WORDS.values(), *COLOURS, *BACKGROUNDS, *SHAPES, *(s + "s" for s in SHAPES)]
    phrases += [*POSITIONS, *POSITION_PHRASES.values(), *DIRECTIONS, "moving", "on a background at the"]
    for phrase in phrases:
        for word in phrase.split():
            if word not in words:
                words.append(word)
    return words


def _split(items: list[tuple], seed: int) -> set[tuple]:
    rng = random.Random(seed)
    return set(rng.sample(items, max(1, round(len(items) * HELD_OUT_FRACTION))))


def held_out_placements() -> set[tuple[str, str, str]]:
    """(colour, shape, position) triples that training never shows."""
    triples = [(c, s, p) for c in COLOURS for s in SHAPES for p in POSITIONS]
    return _split(triples, HELD_OUT_SEED)


def held_out_motions() -> set[tuple[str, str, str]]:
    """(colour, shape, direction) triples that training never shows."""
    triples = [(c, s, d) for c in COLOURS for s in SHAPES for d in DIRECTIONS]
    return _split(triples, HELD_OUT_SEED + 1)


def _background_for(colour: str, rng: random.Random) -> str:
    return rng.choice([b for b in BACKGROUNDS if b != colour])


def _single(rng: random.Random, colour: str, kind: str, position: str) -> Shape:
    fx, fy = POSITIONS[position]
    x = fx * SIZE + rng.uniform(-1.0, 1.0)
    y = fy * SIZE + rng.uniform(-1.0, 1.0)
    return Shape(kind, colour, x, y, rng.uniform(4.5, 6.5))


def _scatter(rng: random.Random, colour: str, kind: str, count: int) -> tuple[Shape, ...]:
    """`count` non-overlapping shapes at random places (rejection sampling; always succeeds quickly)."""
    while True:
        radius = rng.uniform(3.5, 5.0)
        centres = [(rng.uniform(radius + 2, SIZE - radius - 2), rng.uniform(radius + 2, SIZE - radius - 2))]
        for _ in range(count - 1):
            centres.append(
                (rng.uniform(radius + 2, SIZE - radius - 2), rng.uniform(radius + 2, SIZE - radius - 2))
            )
        gaps = [
            ((ax - bx) ** 2 + (ay - by) ** 2) ** 0.5
            for i, (ax, ay) in enumerate(centres)
            for bx, by in centres[i + 1 :]
        ]
        if all(g > 2 * radius + 3 for g in gaps):
            return tuple(Shape(kind, colour, x, y, radius) for x, y in centres)


def sample_image_scene(rng: random.Random, held_out: set[tuple[str, str, str]] | None = None) -> Scene:
    """A random still scene that avoids the held-out (colour, shape, position) triples."""
    held_out = held_out_placements() if held_out is None else held_out
    colour, kind = rng.choice(list(COLOURS)), rng.choice(SHAPES)
    background = _background_for(colour, rng)
    show_background = rng.random() < 0.8
    count = rng.choices([1, 2, 3], weights=[0.7, 0.15, 0.15])[0]
    if count > 1:
        return Scene(_scatter(rng, colour, kind, count), background, show_background=show_background)
    position = rng.choice([p for p in POSITIONS if (colour, kind, p) not in held_out] or list(POSITIONS))
    shape = _single(rng, colour, kind, position)
    return Scene(
        (shape,), background, position, show_position=rng.random() < 0.85, show_background=show_background
    )


def motion_scene(colour: str, kind: str, direction: str, background: str, rng: random.Random) -> Scene:
    """A shape crossing the canvas; (x, y) is where it is halfway through the clip."""
    dx, dy = DIRECTIONS[direction]
    lane = rng.choice([0.3, 0.5, 0.7]) * SIZE + rng.uniform(-1.0, 1.0)
    along = SIZE / 2 + rng.uniform(-1.0, 1.0)
    x, y = (along, lane) if dx else (lane, along)
    shape = Shape(kind, colour, x, y, rng.uniform(4.5, 6.0))
    return Scene((shape,), background, direction=direction, show_background=rng.random() < 0.8)


def sample_clip_scene(rng: random.Random, held_out: set[tuple[str, str, str]] | None = None) -> Scene:
    """A random moving scene that avoids the held-out (colour, shape, direction) triples."""
    held_out = held_out_motions() if held_out is None else held_out
    while True:
        colour, kind, direction = rng.choice(list(COLOURS)), rng.choice(SHAPES), rng.choice(list(DIRECTIONS))
        if (colour, kind, direction) not in held_out:
            return motion_scene(colour, kind, direction, _background_for(colour, rng), rng)


def evaluation_image_scenes(seed: int = 0) -> list[Scene]:
    """One captioned scene per held-out (colour, shape, position) triple, with an explicit background."""
    rng = random.Random(seed)
    scenes = []
    for colour, kind, position in sorted(held_out_placements()):
        shape = _single(rng, colour, kind, position)
        scenes.append(Scene((shape,), _background_for(colour, rng), position))
    return scenes


def evaluation_clip_scenes(seed: int = 0) -> list[Scene]:
    """One captioned clip per held-out (colour, shape, direction) triple, with an explicit background."""
    rng = random.Random(seed)
    return [
        dataclasses.replace(motion_scene(c, kind, d, _background_for(c, rng), rng), show_background=True)
        for c, kind, d in sorted(held_out_motions())
    ]
