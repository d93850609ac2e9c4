"""GLM-Image's AR model on the AR engine, writing the image tokens its DiT renders from.

`GlmImagePipeline.generate_prior_tokens` asks `GlmImageForConditionalGeneration.generate` for a text-to-image
prompt (the chat turn, then `<sop>H W<eop>` for the target grid and for a small preview grid, then the
image-start marker) and samples `preview + target` tokens: first the preview grid's, then the target's, each
positioned by multimodal RoPE on its grid (t, row, column), as `get_rope_index` plans them. On the engine the
text model is the decoder, the LM head (over the vision vocabulary) the head, and the planned positions of
the generated tokens ride in the request's `position_ids` past the prompt's columns. Ids past the VQ
codebook (markers) are never image tokens: a logits processor keeps them out.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnistage.stages.ar.attention import ATTENTION_NAME
from omnistage.stages.ar.loader import LoadedModel

AR_FOLDER, PROCESSOR_FOLDER = "vision_language_encoder", "processor"  # in the diffusers pipeline directory


@dataclasses.dataclass
class GlmImageModel(LoadedModel):
    """The AR engine's parts, and what the input processor reads."""

    glm: nn.Module | None = None  # GlmImageForConditionalGeneration
    processor: Any = None  # GlmImageProcessor (tokenizer, chat template, target grids)
    default_size: int = 1024  # height and width where a request names none (`default_size`)
    size_multiple: int = 32  # the AR grid's cell, in pixels


def load_glm_image(model_dir: str, dtype: torch.dtype, device: str) -> GlmImageModel:
    """The AR engine's `model_loader` for a GLM-Image pipeline directory (its AR model and processor)."""
    from transformers import GlmImageForConditionalGeneration, GlmImageProcessor

    root = Path(model_dir)
    glm = GlmImageForConditionalGeneration.from_pretrained(root / AR_FOLDER, dtype=dtype).to(device).eval()
    lm = glm.model.language_model
    lm.config._attn_implementation = ATTENTION_NAME  # the engine's decoder attends through the paged cache
    # three position rows (t, row, column) whether or not the checkpoint spells its sections out
    lm.config.rope_parameters = {
        **lm.config.rope_parameters,
        "mrope_section": list(lm.rotary_emb.mrope_section),
    }
    processor = GlmImageProcessor.from_pretrained(root / PROCESSOR_FOLDER)
    codebook = int(glm.config.vq_config.num_embeddings)
    return GlmImageModel(
        embed=lm.get_input_embeddings(),
        decoder=lm,
        head=glm.lm_head,
        config=lm.config,
        tokenizer=processor.tokenizer,
        eos_token_ids=[],  # an image is exactly its grids' tokens
        root=glm,
        logits_processors=[CodebookOnly(codebook)],
        glm=glm,
        processor=processor,
        default_size=default_size(root),
    )


class CodebookOnly:
    """Logits past the VQ codebook (the image markers and spare ids of the head) at -inf: the DiT embeds
    codebook ids only (the reference checkpoint's `suppress_tokens` do the same in `generate`)."""

    def __init__(self, codebook: int):
        self.codebook = codebook

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        logits[..., self.codebook :] = float("-inf")
        return logits


def default_size(root: Path) -> int:
    """Height and width for a request that names none: its DiT's `sample_size` (128 where unset) times the
    VAE's scale factor, the `default_sample_size` `GlmImagePipeline` keeps (its text-to-image call itself
    needs both given) and what the diffusion engine fills in for the DiT."""
    sample = json.loads((root / "transformer" / "config.json").read_text()).get("sample_size") or 128
    blocks = json.loads((root / "vae" / "config.json").read_text())["block_out_channels"]
    return int(sample) * 2 ** (len(blocks) - 1)


@dataclasses.dataclass
class ImagePrompt:
    """What the AR stage runs for one prompt: the prompt's ids (source images' placeholders replaced by
    their VQ tokens), every position (the prompt's, then the generated tokens'), the grids (rows, columns)
    it writes (text to image: a preview, then the target; image to image: the target alone), and each source
    image's tokens upsampled to the DiT's grid (`prior_token_image_ids`, one [4 * h * w] tensor an image)."""

    token_ids: list[int]
    positions: torch.Tensor  # [3, prompt + generated]
    preview: tuple[int, int]
    target: tuple[int, int]
    sources: list[torch.Tensor] = dataclasses.field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.preview[0] * self.preview[1] + self.target[0] * self.target[1]


def image_prompt(
    model: GlmImageModel, text: str, height: int, width: int, images: list[Any] = ()
) -> ImagePrompt:
    """The prompt `generate_prior_tokens` builds for `text` (and source `images`, to edit) at `height` x
    `width` (the processor's chat template and target grids), its source images' tokens, and
    `get_rope_index`'s positions for it and for the tokens it generates."""
    content = [*({"type": "image", "image": i} for i in images), {"type": "text", "text": text}]
    inputs = model.processor.apply_chat_template(
        [[{"role": "user", "content": content}]],
        tokenize=True,
        target_h=height,
        target_w=width,
        return_dict=True,
        return_tensors="pt",
    )
    ids, grids = inputs["input_ids"], inputs["image_grid_thw"]
    inner = model.glm.model
    positions, _ = inner.get_rope_index(
        ids, image_grid_thw=grids, images_per_sample=inputs["images_per_sample"]
    )
    planned = inner._cached_decode_position_ids[0]  # [3, generated + the end marker]
    sources: list[torch.Tensor] = []
    if images:
        source_grids = grids[: len(images)]
        with torch.inference_mode():
            embeds = inner.get_image_features(inputs["pixel_values"], source_grids).pooler_output
            # per image, as the model's own forward tokenizes them (diffusers 0.42's `generate_prior_tokens`
            # concatenates the feature maps first, which transformers 5.25's VQ encoder cannot read)
            tokens = inner.get_image_tokens(embeds, source_grids)
        ids = ids.masked_scatter(ids == model.glm.config.image_token_id, tokens)
        for part, grid in zip(torch.split(tokens, source_grids.prod(-1).tolist()), source_grids, strict=True):
            sources.append(upsampled(part, int(grid[1]), int(grid[2]))[0])
        target, preview = tuple(int(v) for v in grids[-1][1:]), (0, 0)
    else:
        target, preview = (tuple(int(v) for v in g[1:]) for g in grids)
    prompt = ImagePrompt(ids[0].tolist(), positions[:, 0], preview, target, sources)
    prompt.positions = torch.cat([positions[:, 0], planned[:, : prompt.num_tokens]], dim=1)
    return prompt


def upsampled(tokens: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """A grid's tokens upsampled 2x to the DiT's grid, as the pipeline's `_upsample_token_ids` ([1, 4 * rows
    * columns])."""
    grid = tokens.to(torch.float32).view(1, 1, rows, columns)
    return nn.functional.interpolate(grid, scale_factor=2, mode="nearest").to(torch.long).view(1, -1)


def target_tokens(tokens: list[int], prompt_grids: tuple[tuple[int, int], tuple[int, int]]) -> torch.Tensor:
    """The target grid's tokens (after the preview's, if any) upsampled 2x to the DiT's grid, as the
    pipeline's `_extract_large_image_tokens` and `_upsample_token_ids` make `prior_token_ids`."""
    (preview_h, preview_w), (rows, columns) = prompt_grids
    start = preview_h * preview_w
    return upsampled(torch.tensor(tokens[start : start + rows * columns]), rows, columns)
