"""A PNG of what the demo model draws (docs/demo_model_samples.png): held-out captions, images and clips.

`python -m omnistage.demo.sample_grid [PIPELINE_DIR] [OUT.png]` regenerates it (defaults: the committed
model and the docs path).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
from diffusers import DiffusionPipeline
from PIL import Image, ImageDraw

from omnistage.demo.evaluate import generate, held_out_scenes
from omnistage.demo.scenes import SIZE

SCALE = 4  # nearest-neighbour upscaling, so 32x32 pixels stay visible
CAPTION_HEIGHT = 34


def _tile(frame: np.ndarray, caption: str) -> Image.Image:
    picture = Image.fromarray(frame).resize((SIZE * SCALE, SIZE * SCALE), Image.NEAREST)
    tile = Image.new("RGB", (SIZE * SCALE, SIZE * SCALE + CAPTION_HEIGHT), "white")
    tile.paste(picture, (0, 0))
    lines = textwrap.wrap(caption, width=22)[:3]
    ImageDraw.Draw(tile).multiline_text((2, SIZE * SCALE + 1), "\n".join(lines), fill="black", spacing=0)
    return tile


def _rows(tiles: list[Image.Image], per_row: int) -> Image.Image:
    width, height = tiles[0].size
    rows = (len(tiles) + per_row - 1) // per_row
    sheet = Image.new("RGB", (per_row * width, rows * height), "white")
    for index, tile in enumerate(tiles):
        sheet.paste(tile, ((index % per_row) * width, (index // per_row) * height))
    return sheet


def sample_grid(pipe: DiffusionPipeline, images: int = 16, clips: int = 4) -> Image.Image:
    """Held-out image captions (8 per row) above held-out motion clips (one clip per row, every frame)."""
    image_scenes, clip_scenes = held_out_scenes(1)
    image_scenes, clip_scenes = image_scenes[:images], clip_scenes[:clips]
    image_frames = generate(pipe, [s.caption for s in image_scenes], num_frames=1)
    clip_frames = generate(pipe, [s.caption for s in clip_scenes], num_frames=clip_scenes[0].num_frames)
    sheets = [_rows([_tile(f[0], s.caption) for f, s in zip(image_frames, image_scenes, strict=True)], 8)]
    for video, scene in zip(clip_frames, clip_scenes, strict=True):
        tiles = [_tile(frame, f"frame {i}" if i else scene.caption) for i, frame in enumerate(video)]
        sheets.append(_rows(tiles, len(tiles)))
    width = max(sheet.width for sheet in sheets)
    grid = Image.new("RGB", (width, sum(sheet.height for sheet in sheets)), "white")
    top = 0
    for sheet in sheets:
        grid.paste(sheet, (0, top))
        top += sheet.height
    return grid


def main(argv: list[str] | None = None) -> int:
    from omnistage.demo.model import demo_model_dir

    args = sys.argv[1:] if argv is None else argv
    pipe_dir = Path(args[0]) if args else demo_model_dir()
    out = Path(args[1]) if len(args) > 1 else Path("docs/demo_model_samples.png")
    sample_grid(DiffusionPipeline.from_pretrained(pipe_dir)).save(out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
