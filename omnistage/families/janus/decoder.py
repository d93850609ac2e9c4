"""Janus-Pro's LM on the AR engine writing image tokens, with classifier-free guidance.

`JanusForConditionalGeneration.generate(generation_mode="image")` runs the Llama LM on the prompt and on a
copy whose tokens other than BOS and the image-start marker are pads (the unconditional half of a doubled
batch), picks each image token from the generation head's logits under `ClassifierFreeGuidanceLogitsProcessor`
and feeds both halves the token's generation embedding (generation_embeddings → generation_aligner), for
`num_image_tokens` steps. On the engine: the LM is the decoder, the generation head the head, the pad copy
the request's guidance twin (`ARInputs.guidance`, stages/ar/guidance.py: the engine combines the logits the
same way), and the post-sample hook (`janus_image_embeds`) feeds the generation embedding back.

Janus also understands images: `generate` in text mode (its default) answers a chat turn whose image
placeholders the processor expanded and whose image tokens the vision encoder's aligned features replace,
from the LM head. Such a request picks the "text" head (`ARInputs.head`) and its prompt's embeddings
(`understanding_embeds`); the hook feeds its tokens back as the LM embeds them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from omnistage.stages.ar.attention import ATTENTION_NAME
from omnistage.stages.ar.loader import LoadedModel
from omnistage.stages.ar.post_sample import PostSample, SampledStep


@dataclasses.dataclass
class JanusModel(LoadedModel):
    """The AR engine's parts, and the model the hook and the input processor read."""

    janus: nn.Module | None = None  # JanusForConditionalGeneration
    processor: Any = None  # JanusProcessor: chat template, image placeholders, pixels
    ids: dict[str, int] = dataclasses.field(default_factory=dict)  # bos, boi, pad
    num_image_tokens: int = 0
    image_size: int = 384
    guidance_scale: float = 5.0


def load_janus(model_dir: str, dtype: torch.dtype, device: str) -> JanusModel:
    """The AR engine's `model_loader` for a Janus checkpoint directory (`from_pretrained`)."""
    from transformers import AutoTokenizer, JanusForConditionalGeneration, JanusProcessor

    janus = JanusForConditionalGeneration.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    lm = janus.model.language_model
    lm.config._attn_implementation = ATTENTION_NAME  # the engine's decoder attends through the paged cache
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    gen = janus.generation_config
    ids = marker_ids(tokenizer, gen)
    model = janus.model
    return JanusModel(
        embed=lm.get_input_embeddings(),
        decoder=lm,
        head=model.generation_head,
        config=lm.config,
        tokenizer=tokenizer,
        eos_token_ids=[],  # an image is num_image_tokens tokens, no end marker
        root=janus,
        step_modules=[model.generation_embeddings, model.generation_aligner],
        heads={"text": janus.lm_head},
        janus=janus,
        processor=JanusProcessor.from_pretrained(model_dir),
        ids=ids,
        num_image_tokens=int(model.vision_model.config.num_image_tokens),
        image_size=int(model.vision_model.config.image_size),
        guidance_scale=float(getattr(gen, "guidance_scale", None) or 5.0),
    )


def janus_image_embeds(model: JanusModel, step: SampledStep) -> PostSample:
    """Post-sample hook: each sampled image token's generation embedding, fed to the next step (a text
    answer's token: the LM's embedding of it)."""
    text = torch.tensor([i.head == "text" for i in step.inputs], device=step.token_ids.device)
    if not bool(text.any()):
        return PostSample(
            next_embeds=model.janus.prepare_embeddings_for_image_generation(step.token_ids[:, None])[:, 0]
        )
    embeds = model.embed(step.token_ids)
    image = ~text
    if bool(image.any()):
        made = model.janus.prepare_embeddings_for_image_generation(step.token_ids[image][:, None])[:, 0]
        embeds[image] = made.to(embeds.dtype)
    return PostSample(next_embeds=embeds)


def understanding_embeds(
    model: JanusModel, input_ids: torch.Tensor, pixel_values: torch.Tensor
) -> torch.Tensor:
    """The prompt's embeddings as `JanusModel.forward` makes them: token embeddings, the image tokens'
    replaced by the vision encoder's aligned features ([L, H])."""
    inner = model.janus.model
    with torch.inference_mode():
        embeds = inner.get_input_embeddings()(input_ids)
        features = inner.get_image_features(pixel_values.to(embeds.dtype), return_dict=True).pooler_output
        features = features.reshape(-1, embeds.shape[-1]).to(embeds.dtype)
        mask = (input_ids == inner.config.image_token_id)[..., None].expand_as(embeds)
        return embeds.masked_scatter(mask, features)[0]


def marker_ids(tokenizer: Any, generation_config: Any) -> dict[str, int]:
    """BOS, the image-start marker and the pad, as `generate` reads them (the marker from the tokenizer:
    transformers 5.25 drops the saved `generation_kwargs` that name it)."""
    return {
        "bos": int(generation_config.bos_token_id),
        "boi": int(tokenizer.convert_tokens_to_ids("<begin_of_image>")),
        "pad": int(generation_config.pad_token_id),
    }


def image_prompt(tokenizer: Any, ids: dict[str, int], text: str) -> tuple[list[int], list[int]]:
    """The prompt `generate` reads for `text` (BOS, the chat turn, the image-start marker; `ids`:
    `marker_ids`) and its unconditional copy (every other token a pad)."""
    turn = tokenizer.encode(f"<|User|>: {text}\n\n<|Assistant|>:", add_special_tokens=False)
    prompt = [ids["bos"], *turn, ids["boi"]]
    keep = {ids["bos"], ids["boi"]}
    return prompt, [t if t in keep else ids["pad"] for t in prompt]
