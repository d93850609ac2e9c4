"""Wan's step adapters: the `__call__`s of `WanPipeline` and `WanImageToVideoPipeline` split at their step
boundaries (omnistage/stages/diffusion/adapters.py says how the engine drives them)."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState


class WanT2VAdapter(StepAdapter):
    """Wan2.1 / Wan2.2 text-to-video (`WanPipeline`), including the two-expert `boundary_ratio` layout.

    Wan2.2 TI2V-5B (`expand_timesteps`: a per-token timestep) is served as whole calls.
    """

    modality = "video"

    def __init__(self, pipe: Any, limits: dict[str, int] | None = None, modality: str | None = None):
        super().__init__(pipe, limits, modality)
        self.supports_steps = not pipe.config.get("expand_timesteps", False)

    @property
    def spatial_multiple(self) -> int:
        patch = self._transformer().config.patch_size
        return self.pipe.vae_scale_factor_spatial * patch[1]

    @property
    def temporal_factor(self) -> int:
        return self.pipe.vae_scale_factor_temporal

    def _transformer(self):
        return self.pipe.transformer if self.pipe.transformer is not None else self.pipe.transformer_2

    def _supports(self, name: str) -> bool:
        """The two-expert knobs where there are two experts; the scheduler's shift where it has one (both
        read step by step: a whole call takes neither)."""
        if name in ("guidance_scale_2", "boundary_ratio"):
            two_experts = self.pipe.config.boundary_ratio is not None
            return two_experts and (name == "guidance_scale_2" or self.supports_steps)
        if name == "flow_shift":
            return self.supports_steps and "flow_shift" in self.pipe.scheduler.config
        return super()._supports(name)

    def private_scheduler(self, flow_shift: float | None = None) -> Any:
        """The request's own scheduler: the pipeline's, or one like it with the request's shift."""
        if flow_shift is None:
            return super().private_scheduler()
        scheduler = self.pipe.scheduler
        return type(scheduler).from_config(scheduler.config, flow_shift=flow_shift)

    def prepare(self, req: DiffusionRequest) -> StepState:
        pipe, p = self.pipe, req.params
        do_cfg = p.guidance_scale > 1.0
        prompt_embeds, negative_embeds = pipe.encode_prompt(
            prompt=req.prompt,
            negative_prompt=req.negative_prompt,
            do_classifier_free_guidance=do_cfg,
            num_videos_per_prompt=p.num_outputs,
            max_sequence_length=p.max_sequence_length,
            device=self.device,
        )
        dtype = self._transformer().dtype
        scheduler = self.private_scheduler(p.flow_shift)
        scheduler.set_timesteps(p.num_inference_steps, device=self.device)
        latents, extra = self._latents(req)
        scheduler.set_begin_index(0)
        boundary = p.boundary_ratio if p.boundary_ratio is not None else pipe.config.boundary_ratio
        extra.update(
            boundary=None if boundary is None else boundary * scheduler.config.num_train_timesteps,
            guidance=p.guidance_scale,
            guidance_2=p.guidance_scale_2 if p.guidance_scale_2 is not None else p.guidance_scale,
        )
        cond = {"encoder_hidden_states": prompt_embeds.to(dtype)}
        uncond = {"encoder_hidden_states": negative_embeds.to(dtype)} if do_cfg else None
        return StepState(latents, scheduler.timesteps, scheduler, cond, uncond, extra)

    def _latents(self, req: DiffusionRequest) -> tuple[torch.Tensor, dict[str, Any]]:
        p = req.params
        channels = self._transformer().config.in_channels
        latents = self.pipe.prepare_latents(
            p.num_outputs,
            channels,
            p.height,
            p.width,
            p.num_frames,
            torch.float32,
            self.device,
            req.generator(),
            None,
        )
        return latents, {}

    def _high_noise(self, state: StepState) -> bool:
        boundary = state.extra["boundary"]
        return boundary is None or state.timesteps[state.step_index] >= boundary

    def model_name(self, state: StepState) -> str:
        return "transformer" if self._high_noise(state) else "transformer_2"

    def steps_per_model(self, state: StepState) -> dict[str, int] | None:
        """Wan2.2's two experts each see only their share of the steps."""
        if state.extra.get("boundary") is None:
            return None
        high = int((state.timesteps >= state.extra["boundary"]).sum())
        return {"transformer": high, "transformer_2": state.total_steps - high}

    def model_input(self, state: StepState) -> torch.Tensor:
        return state.latents

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        return {
            "hidden_states": self.model_input(state).to(self._transformer().dtype),
            "timestep": t.expand(state.rows),
        }

    def guide(self, state: StepState, cond: torch.Tensor, uncond: torch.Tensor | None) -> torch.Tensor:
        if uncond is None:
            return cond
        scale = state.extra["guidance"] if self._high_noise(state) else state.extra["guidance_2"]
        return uncond + scale * (cond - uncond)

    def decode(self, state: StepState) -> torch.Tensor:
        vae = self.pipe.vae
        latents = state.latents.to(vae.device, dtype=vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
        video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
        return torch.as_tensor(self.pipe.video_processor.postprocess_video(video, output_type="np"))


class WanI2VAdapter(WanT2VAdapter):
    """Wan image-to-video (`WanImageToVideoPipeline`): the first frame, VAE-encoded, conditions every step."""

    needs_image = True

    def prepare(self, req: DiffusionRequest) -> StepState:
        state = super().prepare(req)
        image_embeds = None
        transformer = self.pipe.transformer
        if transformer is not None and transformer.config.image_dim is not None:
            embeds = self.pipe.encode_image(req.images[0], self.device)
            image_embeds = embeds.repeat(req.params.num_outputs, 1, 1).to(transformer.dtype)
        state.cond["encoder_hidden_states_image"] = image_embeds
        if state.uncond is not None:
            state.uncond["encoder_hidden_states_image"] = image_embeds
        return state

    def _latents(self, req: DiffusionRequest) -> tuple[torch.Tensor, dict[str, Any]]:
        p, pipe = req.params, self.pipe
        image = pipe.video_processor.preprocess(req.images[0], height=p.height, width=p.width)
        latents, condition = pipe.prepare_latents(
            image.to(self.device, dtype=torch.float32),
            p.num_outputs,
            pipe.vae.config.z_dim,
            p.height,
            p.width,
            p.num_frames,
            torch.float32,
            self.device,
            req.generator(),
            None,
            None,
        )
        return latents, {"condition": condition}

    def model_input(self, state: StepState) -> torch.Tensor:
        return torch.cat([state.latents, state.extra["condition"]], dim=1)
