"""GLM-Image's step adapter: `GlmImagePipeline.__call__` (text to image) split at its step boundaries, with
the prior tokens its AR stage wrote (omnistage/stages/diffusion/adapters.py says how the engine drives it).

The DiT reads the glyph embeddings (the prompt's quoted text through the T5 encoder; "" for the
unconditional branch) and the prior tokens (dropped for the unconditional branch). Glyph lengths differ
between prompts and GLM's attention cannot mask text padding exactly, so only branches of equal text length
share a forward.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState


class GlmImageAdapter(StepAdapter):
    """GLM-Image (`GlmImagePipeline`): text to image from the AR stage's prior tokens, CFG against ""."""

    modality = "image"
    parallel_refused = (
        "runs its branches as they come (glyph texts of different lengths, an edit's source cache), "
        "not split across ranks"
    )

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor * self.pipe.transformer.config.patch_size * 2  # the AR grid's cell

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.glm_image.pipeline_glm_image import calculate_shift, retrieve_timesteps

        pipe, p = self.pipe, req.params
        given = req.inputs if isinstance(req.inputs, dict) else {"prior": req.inputs}
        if not isinstance(given.get("prior"), torch.Tensor):
            raise InvalidRequestError("GLM-Image renders from its AR stage's prior tokens", param="prompt")
        sources = list(given.get("sources") or [])
        if len(sources) != len(req.images):
            raise InvalidRequestError(
                f"{len(req.images)} images to edit but the AR stage read {len(sources)}", param="image"
            )
        k, cfg = p.num_outputs, p.guidance_scale > 1
        embeds, negative = pipe.encode_prompt(
            req.prompt,
            cfg,
            num_images_per_prompt=k,
            max_sequence_length=p.max_sequence_length,
            device=self.device,
            dtype=pipe.dtype,
        )
        latents = pipe.prepare_latents(
            k,
            pipe.transformer.config.in_channels,
            p.height,
            p.width,
            embeds.dtype,
            self.device,
            req.generator(),
        )
        scheduler, config = self.private_scheduler(), self.pipe.scheduler.config
        factor, n = pipe.vae_scale_factor, p.num_inference_steps
        seq_len = (p.height // factor) * (p.width // factor) // pipe.transformer.config.patch_size**2
        steps = np.linspace(config.num_train_timesteps, 1.0, n + 1)[:-1].astype(np.int64).astype(np.float32)
        mu = calculate_shift(
            seq_len,
            config.get("base_image_seq_len", 256),
            config.get("base_shift", 0.25),
            config.get("max_shift", 0.75),
        )
        sigmas = steps / config.num_train_timesteps
        timesteps, _ = retrieve_timesteps(scheduler, n, self.device, steps, sigmas, mu=mu)
        prior = given["prior"].to(self.device).repeat_interleave(k, dim=0)
        size = torch.tensor([[p.height, p.width]], dtype=embeds.dtype, device=self.device).repeat(k, 1)
        common = {
            "prior_token_id": prior,
            "target_size": size,
            "crop_coords": torch.zeros_like(size),
        }
        cond = {
            **common,
            "encoder_hidden_states": embeds,
            "prior_token_drop": torch.zeros_like(prior, dtype=torch.bool),
        }
        if sources:  # the source images' keys and values, which the conditional branch attends every step
            cond["kv_caches"] = self._source_cache(req.images, sources, embeds)
        uncond = None
        if cfg:
            drop = torch.ones_like(prior, dtype=torch.bool)
            uncond = {**common, "encoder_hidden_states": negative, "prior_token_drop": drop}
        return StepState(latents, timesteps, scheduler, cond, uncond, {"guidance": p.guidance_scale})

    def _source_cache(self, images: list[Any], sources: list[torch.Tensor], embeds: torch.Tensor) -> Any:
        """`GlmImagePipeline.__call__`'s image-to-image cache: each source image's VAE latents (its mode,
        normalized) through the DiT at timestep 0 with its tokens, keys and values kept; then read."""
        from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache
        from diffusers.pipelines.glm_image.pipeline_glm_image import retrieve_latents

        pipe, vae = self.pipe, self.pipe.vae
        cache = GlmImageKVCache(num_layers=pipe.transformer.config.num_layers)
        cache.set_mode("write")
        shape = (1, vae.config.latent_channels, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(self.device, embeds.dtype)
        std = torch.tensor(vae.config.latents_std).view(shape).to(self.device, embeds.dtype)
        multiple = pipe.vae_scale_factor * pipe.transformer.config.patch_size
        for image, tokens in zip(images, sources, strict=True):
            width, height = image.size
            pixels = pipe.image_processor.preprocess(
                image, height=height // multiple * multiple, width=width // multiple * multiple
            ).to(self.device, embeds.dtype)
            latent = (retrieve_latents(vae.encode(pixels), sample_mode="argmax") - mean) / std
            tokens = tokens.to(self.device)
            pipe.transformer(
                hidden_states=latent,
                encoder_hidden_states=torch.zeros_like(embeds)[:1, :0],
                prior_token_id=tokens,
                prior_token_drop=torch.zeros_like(tokens, dtype=torch.bool),
                timestep=torch.zeros((1,), device=self.device),
                target_size=torch.tensor([pixels.shape[-2:]], device=self.device),
                crop_coords=torch.zeros((1, 2), device=self.device),
                kv_caches=cache,
            )
        cache.next_sample()
        cache.set_mode("read")
        return cache

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        return {
            "hidden_states": state.latents.to(self.pipe.transformer.dtype),
            "timestep": t.expand(state.rows) - 1,
        }

    def forward_groups(self, inputs: list[dict[str, Any]]) -> list[list[int]]:
        """Equal glyph lengths share a forward; a branch that attends source images' cache runs alone."""
        groups: dict[tuple[int, int], list[int]] = {}
        for i, branch in enumerate(inputs):
            alone = id(branch["kv_caches"]) if "kv_caches" in branch else 0
            groups.setdefault((branch["encoder_hidden_states"].shape[1], alone), []).append(i)
        return list(groups.values())

    def guide(self, state: StepState, cond: torch.Tensor, uncond: torch.Tensor | None) -> torch.Tensor:
        if uncond is None:
            return cond.float()
        return uncond.float() + state.extra["guidance"] * (cond.float() - uncond.float())

    def decode(self, state: StepState) -> torch.Tensor:
        vae = self.pipe.vae
        shape = (1, vae.config.latent_channels, 1, 1)
        latents = state.latents.to(vae.dtype)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        std = torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
        image = vae.decode(latents * std + mean, return_dict=False)[0]
        return torch.as_tensor(self.pipe.image_processor.postprocess(image, output_type="np"))
