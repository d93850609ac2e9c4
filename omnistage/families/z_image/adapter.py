"""Z-Image's step adapter: `ZImagePipeline.__call__` split at its step boundaries (omnistage/stages/diffusion/
adapters.py says how the engine drives it).

Its transformer takes per-row lists (latents, and prompt embeddings of each row's own length, unpadded) and
returns a list; `run_model` converts between those and the engine's row-stacked tensors, so rows of many
requests (and prompts of any length) share one forward. Guidance is Z-Image's own: `pos + g * (pos - neg)`,
optionally renormalized (`cfg_normalization`) and switched off past `cfg_truncation`."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState


class ZImageAdapter(StepAdapter):
    modality = "image"
    latent_input = "x"
    parallel_refused = "takes per-row lists in its transformer (its rows are not split across ranks)"

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.z_image.pipeline_z_image import (
            calculate_shift,
            get_default_z_image_sigmas,
            retrieve_timesteps,
        )

        pipe, p = self.pipe, req.params
        do_cfg = p.guidance_scale > 0
        positive, negative = pipe.encode_prompt(
            prompt=req.prompt,
            negative_prompt=req.negative_prompt,
            do_classifier_free_guidance=do_cfg,
            device=self.device,
            max_sequence_length=p.max_sequence_length,
        )
        n = p.num_outputs
        latents = pipe.prepare_latents(
            n, pipe.transformer.in_channels, p.height, p.width, torch.float32, self.device, req.generator()
        )
        positive = [e for e in positive for _ in range(n)]
        negative = [e for e in negative for _ in range(n)]
        config = pipe.scheduler.config
        mu = calculate_shift(
            (latents.shape[2] // 2) * (latents.shape[3] // 2),
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        scheduler = self.private_scheduler()
        sigmas = get_default_z_image_sigmas(p.num_inference_steps)
        timesteps, _ = retrieve_timesteps(scheduler, p.num_inference_steps, self.device, sigmas=sigmas, mu=mu)
        scheduler.set_begin_index(0)
        truncation = float(p.extra.get("cfg_truncation", 1.0))
        extra = {
            "guidance": p.guidance_scale,
            "normalization": float(p.extra.get("cfg_normalization") or 0.0),
            # Steps past the truncation point run without guidance (the pipeline's `_precomputed_t_norms`).
            "guided": [(1000 - float(t)) / 1000 <= truncation for t in timesteps]
            if truncation <= 1
            else None,
        }
        cond = {"cap_feats": positive}
        uncond = {"cap_feats": negative} if do_cfg else None
        return StepState(latents, timesteps, scheduler, cond, uncond, extra)

    def branch_inputs(self, state: StepState) -> list[dict[str, Any]]:
        guided = state.extra["guided"]
        branches = super().branch_inputs(state)
        if guided is not None and not guided[state.step_index]:
            return branches[:1]  # guidance switched off at this step: the positive branch alone
        return branches

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        return {
            "x": state.latents.to(self.pipe.transformer.dtype),
            "t": (1000 - t.expand(state.rows)) / 1000,
        }

    def run_model(self, module: torch.nn.Module, kwargs: dict[str, Any]) -> torch.Tensor:
        rows = list(kwargs["x"].unsqueeze(2).unbind(dim=0))
        out = module(rows, kwargs["t"], kwargs["cap_feats"], return_dict=False)[0]
        return torch.stack([row.float() for row in out]).squeeze(2)

    def guide(self, state: StepState, cond: torch.Tensor, uncond: torch.Tensor | None) -> torch.Tensor:
        if uncond is None:
            return cond
        scale, limit = state.extra["guidance"], state.extra["normalization"]
        preds = []
        for pos, neg in zip(cond.float(), uncond.float(), strict=True):  # per row, as the pipeline does
            pred = pos + scale * (pos - neg)
            if limit > 0:
                ceiling = torch.linalg.vector_norm(pos) * limit
                norm = torch.linalg.vector_norm(pred)
                if norm > ceiling:
                    pred = pred * (ceiling / norm)
            preds.append(pred)
        return torch.stack(preds)

    def advance(self, state: StepState, noise_pred: torch.Tensor) -> None:
        t = state.timesteps[state.step_index]
        state.latents = state.scheduler.step(-noise_pred.float(), t, state.latents, return_dict=False)[0]
        state.step_index += 1

    def decode(self, state: StepState) -> torch.Tensor:
        vae = self.pipe.vae
        latents = state.latents.to(vae.dtype) / vae.config.scaling_factor + vae.config.shift_factor
        image = vae.decode(latents, return_dict=False)[0]
        return torch.as_tensor(self.pipe.image_processor.postprocess(image, output_type="np"))
