"""Stable Diffusion 3's step adapter: `StableDiffusion3Pipeline.__call__` split at its step boundaries
(omnistage/stages/diffusion/adapters.py says how the engine drives it)."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState


class SD3Adapter(StepAdapter):
    """Stable Diffusion 3 / 3.5 (`StableDiffusion3Pipeline`): classic CFG over CLIP+CLIP+T5 embeddings."""

    modality = "image"

    cfg_in_batch = True

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor * self.pipe.patch_size

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import (
            calculate_shift,
            retrieve_timesteps,
        )

        pipe, p = self.pipe, req.params
        do_cfg = p.guidance_scale > 1
        embeds, n_embeds, pooled, n_pooled = pipe.encode_prompt(
            prompt=req.prompt,
            prompt_2=None,
            prompt_3=None,
            negative_prompt=req.negative_prompt,
            do_classifier_free_guidance=do_cfg,
            device=self.device,
            clip_skip=None,
            num_images_per_prompt=p.num_outputs,
            max_sequence_length=p.max_sequence_length,
        )
        latents = pipe.prepare_latents(
            p.num_outputs,
            pipe.transformer.config.in_channels,
            p.height,
            p.width,
            embeds.dtype,
            self.device,
            req.generator(),
            None,
        )
        cfg, kwargs = pipe.scheduler.config, {}
        if cfg.get("use_dynamic_shifting", None):
            patch = pipe.transformer.config.patch_size
            seq_len = (latents.shape[2] // patch) * (latents.shape[3] // patch)
            kwargs["mu"] = calculate_shift(
                seq_len,
                cfg.get("base_image_seq_len", 256),
                cfg.get("max_image_seq_len", 4096),
                cfg.get("base_shift", 0.5),
                cfg.get("max_shift", 1.16),
            )
        scheduler = self.private_scheduler()
        timesteps, _ = retrieve_timesteps(
            scheduler, p.num_inference_steps, self.device, sigmas=None, **kwargs
        )
        cond = {"encoder_hidden_states": embeds, "pooled_projections": pooled}
        uncond = {"encoder_hidden_states": n_embeds, "pooled_projections": n_pooled} if do_cfg else None
        return StepState(latents, timesteps, scheduler, cond, uncond, {"guidance": p.guidance_scale})

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        return {
            "hidden_states": state.latents,
            "timestep": state.timesteps[state.step_index].expand(state.rows),
        }

    def decode(self, state: StepState) -> torch.Tensor:
        vae = self.pipe.vae
        latents = (state.latents / vae.config.scaling_factor) + vae.config.shift_factor
        image = vae.decode(latents, return_dict=False)[0]
        return torch.as_tensor(self.pipe.image_processor.postprocess(image, output_type="np"))
