"""Janus-Pro: text → the LM's image tokens (AR with classifier-free guidance, decoder.py) → the VQ-VAE's
image (the render stage).

Stage 0 writes `num_image_tokens` image tokens as `generate(generation_mode="image")` does: each from the
generation head's guided logits (the checkpoint's guidance scale, 5), sampled with the request's sampling
parameters (the checkpoint samples at temperature 1; `top_k: 1` is its greedy image). Stage 1, on the
generation engine, renders them in one pass (`decode_image_tokens`, then to 8-bit RGB as the image
processor's `postprocess` does it: unnormalized with its mean and std, scaled to 255, clipped, truncated).

Asked for text (chat's default), stage 0 answers instead, images in the chat understood (`generate` in
text mode) and is the final stage; stage 1 runs only for an image.
"""

from __future__ import annotations

from collections.abc import Generator as Steps
from pathlib import Path
from typing import Any

import msgspec
import torch

from omnistage.config.capabilities import Capabilities
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.outputs import TokenCounts
from omnistage.prompts import ChatPrompt, prompt_text
from omnistage.stages.base import EngineContext, StageInputContext, StageRequest
from omnistage.stages.generation.engine import GenerationBatch, GenerationEngine, one_unit
from omnistage.stages.generation.generation_inputs import GenerationInputs

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py
_MODELS = "omnistage.families.janus"
MAX_IMAGES = 4  # a request's images (each a sequence beside its twin: 8 of stage 0's max_num_seqs)


# The image routes' fields Janus cannot honour (they reach stage 0 in `SamplingParams.extra`).
UNSUPPORTED = {
    "image": "Janus does not edit images",
    "mask": "Janus does not edit images",
    "negative_prompt": "Janus guides against an empty prompt, not a negative one",
    "num_inference_steps": "Janus writes image tokens, it takes no denoising steps",
    "guidance_scale_2": "Janus has one guidance scale",
    "true_cfg_scale": "Janus has one guidance scale (guidance_scale)",
    "num_frames": "Janus renders still images",
    "fps": "Janus renders still images",
}


def _guidance(loaded: Any, extra: dict[str, Any]) -> float:
    """The route's image fields checked against the model (its one size; no edits, steps or negative
    prompt): the guidance scale to use (the checkpoint's unless `guidance_scale` is given)."""
    for name, why in UNSUPPORTED.items():
        if extra.get(name) is not None:
            raise InvalidRequestError(f"{name}: {why}", param=name)
    size = loaded.image_size
    for name in ("width", "height"):
        if extra.get(name) not in (None, size):
            raise InvalidRequestError(f"size: Janus renders {size}x{size} images", param="size")
    scale = extra.get("guidance_scale")
    if scale is None:
        return loaded.guidance_scale
    if not 1.0 <= float(scale) <= 20.0:
        raise InvalidRequestError("guidance_scale: must be within [1, 20]", param="guidance_scale")
    return float(scale)


def lm_input(ctx: StageInputContext) -> StageRequest:
    """An image asked for: its tokens (`image_input`); else a text answer to the chat, images and all
    (`understanding_input`)."""
    return image_input(ctx) if "image" in ctx.modalities else understanding_input(ctx)


def understanding_input(ctx: StageInputContext) -> StageRequest:
    """A chat turn (text and images) → the processor's prompt, its image tokens' embeddings the vision
    encoder's; answered from the LM head until the end-of-text token, as `generate` in text mode."""
    from omnistage import media
    from omnistage.families.janus.decoder import understanding_embeds
    from omnistage.stages.ar.ar_inputs import ARInputs

    loaded = ctx.resources
    prompt = ctx.prompt
    messages = (
        prompt.messages
        if isinstance(prompt, ChatPrompt)
        else [{"role": "user", "content": prompt_text(prompt)}]
    )
    turns = [
        {
            **m,
            "content": [{"type": "text", "text": m["content"]}]
            if isinstance(m.get("content"), str)
            else m["content"],
        }
        for m in messages
    ]
    images = [media.decode_image(i).convert("RGB") for i in getattr(prompt, "images", [])]
    placeholders = sum(p.get("type") == "image" for m in turns for p in m["content"])
    if placeholders != len(images):
        raise InvalidRequestError(
            f"the messages hold {placeholders} image parts but {len(images)} images came", param="messages"
        )
    text = loaded.processor.apply_chat_template(turns, add_generation_prompt=True, tokenize=False)
    inputs = loaded.processor(text=text, images=images or None, return_tensors="pt")
    ids = inputs["input_ids"]
    embeds = understanding_embeds(loaded, ids, inputs["pixel_values"]) if images else None
    # The LM's EOS is no engine EOS (an image has no end marker): text ends at it as a stop token, unless
    # the request ignores EOS.
    eos = [] if ctx.params.ignore_eos else [int(loaded.janus.generation_config.eos_token_id)]
    params = msgspec.structs.replace(
        ctx.params, stop_token_ids=sorted({*(ctx.params.stop_token_ids or []), *eos}), detokenize=True
    )
    counts = TokenCounts(input_text_tokens=ids.shape[1])
    arinputs = ARInputs(inputs_embeds=embeds, head="text")
    return StageRequest(
        ctx.request_id, prompt=ids[0].tolist(), params=params, inputs=arinputs, token_counts=counts
    )


def image_input(ctx: StageInputContext) -> StageRequest:
    """A prompt → the LM's image prompt and its unconditional twin; exactly `num_image_tokens` tokens."""
    from omnistage.families.janus.decoder import image_prompt
    from omnistage.stages.ar.ar_inputs import ARInputs
    from omnistage.stages.ar.guidance import Guidance

    loaded = ctx.resources
    text = prompt_text(ctx.prompt)
    if not text.strip():
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    params = ctx.params
    if not 1 <= int(getattr(params, "n", 1) or 1) <= MAX_IMAGES:
        raise InvalidRequestError(f"n: Janus renders 1 to {MAX_IMAGES} images a request", param="n")
    scale = _guidance(loaded, dict(getattr(params, "extra", None) or {}))
    ids, unconditional = image_prompt(loaded.tokenizer, loaded.ids, text)
    tokens = loaded.num_image_tokens
    params = msgspec.structs.replace(
        params, max_tokens=tokens, min_tokens=tokens, ignore_eos=True, extra={}, detokenize=False
    )
    inputs = ARInputs(guidance=Guidance(scale, prompt_token_ids=unconditional))
    counts = TokenCounts(input_text_tokens=len(ids))
    return StageRequest(ctx.request_id, prompt=ids, params=params, inputs=inputs, token_counts=counts)


def render_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: the request's image tokens (each of its `n` sequences' in index order), rendered at
    once."""
    results = [ctx.upstream[0], *ctx.upstream_choices.get(0, [])]
    tokens = torch.tensor([t for r in results for t in r.token_ids], dtype=torch.long)
    return StageRequest(ctx.request_id, params=ctx.params, inputs=GenerationInputs(tokens))


def to_rgb(pixels: torch.Tensor, processor: Any) -> torch.Tensor:
    """Decoded pixels [N, H, W, 3] → uint8, as `JanusImageProcessor.postprocess` makes them."""
    mean = torch.tensor(processor.image_mean, dtype=torch.float32)
    std = torch.tensor(processor.image_std, dtype=torch.float32)
    scaled = (pixels.float().cpu() * std + mean) * (1.0 / processor.rescale_factor)
    return scaled.clip(0, 255).to(torch.uint8)


class JanusRender:
    """The generation engine's generator for stage 1: a window of n images' tokens [n x T] → the images
    [n, H, W, 3] uint8 (`decode_image_tokens`, `to_rgb`)."""

    outputs_per_frame, sample_rate, emits_spans = 1, None, True

    def __init__(self, model_dir: str, device: str):
        from transformers import JanusForConditionalGeneration, JanusImageProcessorPil

        janus = JanusForConditionalGeneration.from_pretrained(model_dir).eval()
        self.vq = janus.model.vqmodel.to(device)  # the rest of the model stays with stage 0
        self.tokens = int(janus.model.vision_model.config.num_image_tokens)
        self.processor = JanusImageProcessorPil.from_pretrained(model_dir)

    def run(self, batch: GenerationBatch) -> Steps[None, None, list[torch.Tensor]]:
        return one_unit(lambda: [self.render(w) for w in batch.windows])

    def render(self, tokens: torch.Tensor) -> torch.Tensor:
        return to_rgb(self.pixels(tokens), self.processor)

    def pixels(self, tokens: torch.Tensor) -> torch.Tensor:
        """The VQ decoder's pixels [N, H, W, 3] for N images' tokens, as `decode_image_tokens` makes them."""
        device = next(self.vq.parameters()).device
        grids = tokens.to(device, torch.long).reshape(-1, self.tokens)
        with torch.inference_mode():
            return self.vq.decode(grids).permute(0, 2, 3, 1)


def create_render_engine(ctx: EngineContext) -> GenerationEngine:
    return GenerationEngine(
        JanusRender(str(ctx.model_dir), ctx.device), max_num_seqs=ctx.deploy.max_num_seqs, output_key="images"
    )


JANUS = PipelineSpec(
    name="janus",
    stages=(
        StageSpec(
            stage_id=0,
            name="lm",
            kind=StageKind.AR,
            final_output=True,
            output_modality="text",
            input_processor=lm_input,
            engine_args={
                "model_loader": f"{_MODELS}.decoder:load_janus",
                "post_sample_hook": f"{_MODELS}.decoder:janus_image_embeds",
            },
        ),
        StageSpec(
            stage_id=1,
            name="render",
            kind=StageKind.GENERATION,
            inputs=(0,),
            final_output=True,
            output_modality="image",
            input_processor=render_input,
            engine=f"{_MODELS}.pipeline:create_render_engine",
        ),
    ),
    architectures=("JanusForConditionalGeneration",),
    default_deploy=str(HERE / "janus.yaml"),
    default_modalities=("text",),  # chat answers in text unless `modalities` asks for the image
    family=FAMILY,
    # the image routes' (and chat's, answering with the image) fields reach the LM: its seed and n; size and
    # guidance checked by image_input
    capabilities=Capabilities(
        routes=("images", "chat"), prompt="chat", fields={"sampling": (0,), "diffusion": (0,)}
    ),
)
