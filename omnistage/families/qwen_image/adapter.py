"""Qwen-Image's step adapter: `QwenImagePipeline.__call__` split at its step boundaries
(omnistage/stages/diffusion/adapters.py says how the engine drives it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.families.shared.flow_match import guidance_embedding, shifted_timesteps
from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState


class QwenImageAdapter(StepAdapter):
    """Qwen-Image (`QwenImagePipeline`): variable-length text with a mask, true CFG with norm rescaling."""

    modality = "image"

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2

    def prepare(self, req: DiffusionRequest) -> StepState:
        pipe, p = self.pipe, req.params
        k, msl = p.num_outputs, p.max_sequence_length
        do_true_cfg = p.true_cfg_scale > 1 and req.negative_prompt is not None
        embeds, mask = pipe.encode_prompt(
            prompt=req.prompt, device=self.device, num_images_per_prompt=k, max_sequence_length=msl
        )
        latents = pipe.prepare_latents(
            k,
            pipe.transformer.config.in_channels // 4,
            p.height,
            p.width,
            embeds.dtype,
            self.device,
            req.generator(),
            None,
        )
        n = p.num_inference_steps
        scheduler, timesteps = shifted_timesteps(self, latents.shape[1], n, np.linspace(1.0, 1 / n, n))
        guidance = guidance_embedding(self, p.guidance_scale, k)
        shape = (1, p.height // pipe.vae_scale_factor // 2, p.width // pipe.vae_scale_factor // 2)
        cond = {"encoder_hidden_states": embeds, "encoder_hidden_states_mask": mask}
        uncond = None
        if do_true_cfg:
            n_embeds, n_mask = pipe.encode_prompt(
                prompt=req.negative_prompt,
                device=self.device,
                num_images_per_prompt=k,
                max_sequence_length=msl,
            )
            uncond = {"encoder_hidden_states": n_embeds, "encoder_hidden_states_mask": n_mask}
        extra = {
            "guidance": p.true_cfg_scale,
            "guidance_embed": guidance,
            "img_shape": shape,
            "height": p.height,
            "width": p.width,
        }
        return StepState(latents, timesteps, scheduler, cond, uncond, extra)

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        return {
            "hidden_states": state.latents,
            "timestep": t.expand(state.rows).to(state.latents.dtype) / 1000,
            "guidance": state.extra["guidance_embed"],
            "img_shapes": [[state.extra["img_shape"]]] * state.rows,
        }

    def collate(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Pads text to the longest prompt and masks the padding (Qwen's attention honours the mask)."""
        if len(inputs) == 1:
            return inputs[0]
        embeds = [i["encoder_hidden_states"] for i in inputs]
        longest = max(e.shape[1] for e in embeds)
        padded, masks = [], []
        for i, e in zip(inputs, embeds, strict=True):
            mask = i["encoder_hidden_states_mask"]
            if mask is None:
                mask = torch.ones(e.shape[:2], dtype=torch.long, device=e.device)
            pad = longest - e.shape[1]
            padded.append(torch.nn.functional.pad(e, (0, 0, 0, pad)))
            masks.append(torch.nn.functional.pad(mask, (0, pad)))
        out = super().collate([{k: v for k, v in i.items() if not k.startswith("encoder_")} for i in inputs])
        mask = torch.cat(masks)
        out["encoder_hidden_states"] = torch.cat(padded)
        out["encoder_hidden_states_mask"] = None if bool(mask.all()) else mask
        return out

    def guide(self, state: StepState, cond: torch.Tensor, uncond: torch.Tensor | None) -> torch.Tensor:
        if uncond is None:
            return cond
        combined = uncond + state.extra["guidance"] * (cond - uncond)
        cond_norm = torch.norm(cond, dim=-1, keepdim=True)
        return combined * (cond_norm / torch.norm(combined, dim=-1, keepdim=True))

    def decode(self, state: StepState) -> torch.Tensor:
        pipe, vae = self.pipe, self.pipe.vae
        h, w = state.extra["height"], state.extra["width"]
        latents = pipe._unpack_latents(state.latents, h, w, pipe.vae_scale_factor).to(vae.dtype)
        shape = (1, vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
        inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
        image = vae.decode(latents / inv_std + mean, return_dict=False)[0][:, :, 0]
        return torch.as_tensor(pipe.image_processor.postprocess(image, output_type="np"))
