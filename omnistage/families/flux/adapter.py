"""FLUX.1's step adapter: `FluxPipeline.__call__` split at its step boundaries
(omnistage/stages/diffusion/adapters.py says how the engine drives it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.families.shared.flow_match import guidance_embedding, shifted_timesteps
from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState


class FluxAdapter(StepAdapter):
    """FLUX.1 (`FluxPipeline`): guidance-distilled (guidance embedding) plus optional true CFG."""

    modality = "image"
    shared_inputs = frozenset({"txt_ids", "img_ids"})

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2

    def prepare(self, req: DiffusionRequest) -> StepState:
        pipe, p = self.pipe, req.params
        k, msl = p.num_outputs, p.max_sequence_length
        do_true_cfg = p.true_cfg_scale > 1 and req.negative_prompt is not None
        embeds, pooled, text_ids = pipe.encode_prompt(
            prompt=req.prompt,
            prompt_2=None,
            device=self.device,
            num_images_per_prompt=k,
            max_sequence_length=msl,
        )
        channels = pipe.transformer.config.in_channels // 4
        latents, image_ids = pipe.prepare_latents(
            k, channels, p.height, p.width, embeds.dtype, self.device, req.generator(), None
        )
        n = p.num_inference_steps
        sigmas = np.linspace(1.0, 1 / n, n)
        if getattr(pipe.scheduler.config, "use_flow_sigmas", False):
            sigmas = None
        scheduler, timesteps = shifted_timesteps(self, latents.shape[1], n, sigmas)
        guidance = guidance_embedding(self, p.guidance_scale, k)
        shared = {"guidance": guidance, "img_ids": image_ids}
        cond = {**shared, "pooled_projections": pooled, "encoder_hidden_states": embeds, "txt_ids": text_ids}
        uncond = None
        if do_true_cfg:
            n_embeds, n_pooled, n_text_ids = pipe.encode_prompt(
                prompt=req.negative_prompt,
                prompt_2=None,
                device=self.device,
                num_images_per_prompt=k,
                max_sequence_length=msl,
            )
            uncond = {
                **shared,
                "pooled_projections": n_pooled,
                "encoder_hidden_states": n_embeds,
                "txt_ids": n_text_ids,
            }
        extra = {"guidance": p.true_cfg_scale, "height": p.height, "width": p.width}
        return StepState(latents, timesteps, scheduler, cond, uncond, extra)

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        return {
            "hidden_states": state.latents,
            "timestep": t.expand(state.rows).to(state.latents.dtype) / 1000,
        }

    def decode(self, state: StepState) -> torch.Tensor:
        pipe, p = self.pipe, state.extra
        latents = pipe._unpack_latents(state.latents, p["height"], p["width"], pipe.vae_scale_factor)
        latents = (latents / pipe.vae.config.scaling_factor) + pipe.vae.config.shift_factor
        image = pipe.vae.decode(latents.to(pipe.vae.device), return_dict=False)[0]
        return torch.as_tensor(pipe.image_processor.postprocess(image, output_type="np"))
