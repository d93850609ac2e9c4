"""GLM-Image: text → the AR model's image tokens (decoder.py, on the AR engine) → the DiT's image (the
diffusion engine, step by step: adapter.py).

Stage 0 writes a preview grid's and the target grid's tokens as `generate_prior_tokens` does (the
checkpoint samples; `top_k: 1` is its greedy image) and hands the target grid's, upsampled, to stage 1 (full
handoff: the DiT conditions every step on the whole grid), which denoises with progress per step and
decodes. A request's `n` images share one AR draw, as `num_images_per_prompt` does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from omnistage.config.capabilities import Capabilities
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.outputs import TokenCounts
from omnistage.params import DiffusionParams
from omnistage.prompts import TextPrompt, prompt_text
from omnistage.stages.base import StageInputContext, StageRequest

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py
_MODELS = "omnistage.families.glm_image"
GRIDS = "glm_image_grids"  # stage 0's output data: the preview and target grids it wrote
MAX_SIDE = 2048  # pixels a side (GLM-Image's processor default targets 1152 x 768)

# The image routes' fields GLM-Image cannot honour here (they reach stage 0 in `SamplingParams.extra`);
# its DiT checks the rest (steps, guidance, n) against the pipeline.
UNSUPPORTED = {
    "mask": "GLM-Image does not inpaint",
    "negative_prompt": "GLM-Image guides against an empty prompt, not a negative one",
    "true_cfg_scale": "GLM-Image has one guidance scale (guidance_scale)",
    "guidance_scale_2": "GLM-Image has one guidance scale (guidance_scale)",
    "num_frames": "GLM-Image renders still images",
    "fps": "GLM-Image renders still images",
}


def _size(loaded: Any, extra: dict[str, Any], images: list[Any]) -> tuple[int, int]:
    """The size asked for (else the first source image's, to the grid; else the pipeline's default),
    checked."""
    for name, why in UNSUPPORTED.items():
        if extra.get(name) is not None:
            raise InvalidRequestError(f"{name}: {why}", param=name)
    cell = loaded.size_multiple
    fallback = (
        {"width": images[0].size[0] // cell * cell, "height": images[0].size[1] // cell * cell}
        if images
        else {}
    )
    sides = []
    for name in ("height", "width"):
        side = int(extra.get(name) or fallback.get(name) or loaded.default_size)
        if side % loaded.size_multiple or not 0 < side <= MAX_SIDE:
            raise InvalidRequestError(
                f"size: GLM-Image takes sides that are multiples of {loaded.size_multiple} up to {MAX_SIDE}, "
                f"got {side}",
                param="size",
            )
        sides.append(side)
    return sides[0], sides[1]


def image_input(ctx: StageInputContext) -> StageRequest:
    """A prompt → the AR model's image prompt, positioned for the grids it writes; exactly their tokens."""
    from omnistage.families.glm_image.decoder import image_prompt
    from omnistage.stages.ar.ar_inputs import ARInputs

    loaded = ctx.resources
    text = prompt_text(ctx.prompt)
    if not text.strip():
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    extra = dict(getattr(ctx.params, "extra", None) or {})
    images = source_images(ctx.prompt, extra.get("image"))
    height, width = _size(loaded, extra, images)
    prompt = image_prompt(loaded, text, height, width, images)
    tokens = prompt.num_tokens
    params = msgspec.structs.replace(
        ctx.params, n=1, max_tokens=tokens, min_tokens=tokens, ignore_eos=True, extra={}
    )
    grids = {
        "preview": list(prompt.preview),
        "target": list(prompt.target),
        "size": [height, width],
        "sources": [s.tolist() for s in prompt.sources],  # each source image's tokens, for the DiT
    }
    inputs = ARInputs(position_ids=prompt.positions, output_data={GRIDS: grids})
    counts = TokenCounts(input_text_tokens=len(prompt.token_ids))
    return StageRequest(
        ctx.request_id, prompt=prompt.token_ids, params=params, inputs=inputs, token_counts=counts
    )


def source_images(prompt: Any, given: Any) -> list[Any]:
    """The images to edit: the route's (`image`), else the prompt's (a chat turn's pictures)."""
    from omnistage import media

    images = list(given or []) or list(getattr(prompt, "images", None) or [])
    return [media.decode_image(i) for i in images]


def render_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: the target grid's tokens (upsampled), the size stage 0 wrote them for, and the source
    images (to edit) with their tokens."""
    import torch

    from omnistage.families.glm_image.decoder import target_tokens

    result = ctx.upstream[0]
    grids = result.data[GRIDS]
    prior = target_tokens(result.token_ids, (tuple(grids["preview"]), tuple(grids["target"])))
    sources = [torch.tensor(s, dtype=torch.long) for s in grids["sources"]]
    height, width = grids["size"]
    params = ctx.params
    if not isinstance(params, DiffusionParams):
        params = msgspec.convert(params or {}, DiffusionParams)
    for name, side in (("height", height), ("width", width)):
        if getattr(params, name) not in (None, side):
            raise InvalidRequestError(
                f"{name}: GLM-Image's size is its AR stage's (the route's size, or SamplingParams.extra "
                f"height/width); it wrote tokens for {height}x{width}",
                param=name,
            )
    # the images to edit as they came (the diffusion engine decodes a prompt's images)
    images = list(params.image or getattr(ctx.prompt, "images", None) or []) if sources else []
    params = msgspec.structs.replace(params, height=height, width=width, image=None)
    prompt = TextPrompt(text=prompt_text(ctx.prompt), images=images)
    return StageRequest(
        ctx.request_id, prompt=prompt, params=params, inputs={"prior": prior, "sources": sources}
    )


GLM_IMAGE = PipelineSpec(
    name="glm_image",
    stages=(
        StageSpec(
            stage_id=0,
            name="ar",
            kind=StageKind.AR,
            input_processor=image_input,
            sampling_constraints={"detokenize": False},
            engine_args={"model_loader": f"{_MODELS}.decoder:load_glm_image"},
        ),
        StageSpec(
            stage_id=1,
            name="dit",
            kind=StageKind.DIFFUSION,
            inputs=(0,),
            final_output=True,
            output_modality="image",
            input_processor=render_input,
            engine_args={"skip_components": ["vision_language_encoder", "processor"]},
        ),
    ),
    diffusers_classes=("GlmImagePipeline",),
    default_deploy=str(HERE / "glm_image.yaml"),
    family=FAMILY,
    # the image routes' (and chat's, answering with the image) fields: sampling and size to the AR model
    # (size, edits and guidance checked by image_input), steps, guidance and n to the DiT
    capabilities=Capabilities(
        routes=("images", "chat"), prompt="text", fields={"sampling": (0,), "diffusion": (0, 1)}
    ),
)
