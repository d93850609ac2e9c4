"""FLUX.2 Klein's step adapter: `Flux2KleinPipeline.__call__` split at its step boundaries (omnistage/stages/
diffusion/adapters.py says how the engine drives it).

Text comes from a Qwen3 encoder (three of its hidden layers, stacked); images to edit are VAE-encoded once
and their tokens follow the latents' in every forward (the transformer's output over them is dropped).
Requests whose sequences differ (with or without reference images) run in separate forwards of one step."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState

TEXT_LAYERS = (9, 18, 27)  # the pipeline's default `text_encoder_out_layers`


class Flux2KleinAdapter(StepAdapter):
    modality = "image"

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu, retrieve_timesteps

        pipe, p = self.pipe, req.params
        n, layers = p.num_outputs, tuple(p.extra.get("text_encoder_out_layers", TEXT_LAYERS))
        do_cfg = p.guidance_scale > 1 and not pipe.config.is_distilled
        text = {"max_sequence_length": p.max_sequence_length, "text_encoder_out_layers": layers}
        embeds, text_ids = pipe.encode_prompt(
            prompt=req.prompt, device=self.device, num_images_per_prompt=n, **text
        )
        generator = req.generator()
        latents, latent_ids = pipe.prepare_latents(
            n,
            pipe.transformer.config.in_channels // 4,
            p.height,
            p.width,
            embeds.dtype,
            self.device,
            generator,
        )
        extra: dict[str, Any] = {"guidance": p.guidance_scale, "latent_ids": latent_ids}
        references = self._references(req)
        image_latents = None
        if references:
            image_latents, image_ids = pipe.prepare_image_latents(
                references, n, generator, self.device, pipe.vae.dtype
            )
            extra["image_latents"] = image_latents
            extra["image_ids"] = torch.cat([latent_ids, image_ids], dim=1)
        steps = p.num_inference_steps
        sigmas = np.linspace(1.0, 1 / steps, steps)
        if getattr(pipe.scheduler.config, "use_flow_sigmas", False):
            sigmas = None
        scheduler = self.private_scheduler()
        mu = compute_empirical_mu(image_seq_len=latents.shape[1], num_steps=steps)
        timesteps, _ = retrieve_timesteps(scheduler, steps, self.device, sigmas=sigmas, mu=mu)
        if hasattr(scheduler, "set_begin_index"):
            scheduler.set_begin_index(0)
        cond = {"encoder_hidden_states": embeds, "txt_ids": text_ids}
        uncond = None
        if do_cfg:  # Klein's unconditional branch: the empty prompt
            negative, negative_ids = pipe.encode_prompt(
                prompt="", device=self.device, num_images_per_prompt=n, **text
            )
            uncond = {"encoder_hidden_states": negative, "txt_ids": negative_ids}
        return StepState(latents, timesteps, scheduler, cond, uncond, extra)

    def _references(self, req: DiffusionRequest) -> list[torch.Tensor]:
        """The images to edit, sized as the pipeline sizes them (within 1024x1024, multiples of 16)."""
        processor, multiple = self.pipe.image_processor, self.pipe.vae_scale_factor * 2
        out = []
        for image in req.images:
            processor.check_image_input(image)
            width, height = image.size
            if width * height > 1024 * 1024:
                image = processor._resize_to_target_area(image, 1024 * 1024)
                width, height = image.size
            width, height = (width // multiple) * multiple, (height // multiple) * multiple
            out.append(processor.preprocess(image, height=height, width=width, resize_mode="crop"))
        return out

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        hidden, ids = state.latents, state.extra["latent_ids"]
        if "image_latents" in state.extra:
            hidden, ids = (
                torch.cat([state.latents, state.extra["image_latents"]], dim=1),
                state.extra["image_ids"],
            )
        return {
            "hidden_states": hidden.to(self.pipe.transformer.dtype),
            "timestep": t.expand(state.rows).to(state.latents.dtype) / 1000,
            "guidance": None,
            "img_ids": ids,
        }

    def forward_groups(self, inputs: list[dict[str, Any]]) -> list[list[int]]:
        """Inputs of equal sequence lengths share a forward."""
        groups: dict[tuple, list[int]] = {}
        for i, branch in enumerate(inputs):
            shape = (branch["hidden_states"].shape[1:], branch["encoder_hidden_states"].shape[1:])
            groups.setdefault(shape, []).append(i)
        return list(groups.values())

    def guide(self, state: StepState, cond: torch.Tensor, uncond: torch.Tensor | None) -> torch.Tensor:
        length = state.latents.shape[1]  # the reference images' tokens are not predicted
        cond = cond[:, :length]
        if uncond is None:
            return cond
        uncond = uncond[:, :length]
        return uncond + state.extra["guidance"] * (cond - uncond)

    def decode(self, state: StepState) -> torch.Tensor:
        pipe, p = self.pipe, state.extra
        height, width = self._latent_size(state)
        latents = pipe._unpack_latents_with_ids(state.latents, p["latent_ids"], height, width)
        bn = pipe.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(latents.device, latents.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps).to(
            latents.device, latents.dtype
        )
        latents = pipe._unpatchify_latents(latents * std + mean)
        image = pipe.vae.decode(latents.to(pipe.vae.dtype), return_dict=False)[0]
        return torch.as_tensor(pipe.image_processor.postprocess(image, output_type="np"))

    def _latent_size(self, state: StepState) -> tuple[int, int]:
        ids = state.extra["latent_ids"][0]
        return int(ids[:, 1].max()) + 1, int(ids[:, 2].max()) + 1
