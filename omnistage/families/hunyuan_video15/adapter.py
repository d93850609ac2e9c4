"""HunyuanVideo-1.5's step adapter: `HunyuanVideo15Pipeline.__call__` (text to video) split at its step
boundaries (omnistage/stages/diffusion/adapters.py says how the engine drives it).

Text comes from a Qwen2.5-VL text model and a ByT5 encoder of the prompt's quoted (glyph) text; the latents
reach the transformer beside zero condition latents and their mask. Guidance is the pipeline's guider (a
copy per request, at the request's `guidance_scale`): it decides at each step whether the unconditional
branch runs at all, and combines the branches."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState


class HunyuanVideo15Adapter(StepAdapter):
    modality = "video"

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor_spatial * self.pipe.transformer.config.patch_size

    @property
    def temporal_factor(self) -> int:
        return self.pipe.vae_scale_factor_temporal

    def defaults(self) -> dict[str, Any]:
        """The pipeline's own: 16:9 at the transformer's target size when neither side is given."""
        out = super().defaults()
        if out.get("height") is None and out.get("width") is None:
            ratio = self.pipe.default_aspect_ratio
            height, width = self.pipe.video_processor.calculate_default_height_width(
                ratio[1], ratio[0], self.pipe.target_size
            )
            out.update(height=height, width=width)
        return out

    def _supports(self, name: str) -> bool:
        return name == "guidance_scale" or super()._supports(name)

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.hunyuan_video1_5.pipeline_hunyuan_video1_5 import retrieve_timesteps

        pipe, p = self.pipe, req.params
        scale = {} if p.guidance_scale is None else {"guidance_scale": p.guidance_scale}
        guider = pipe.guider.new(**scale)  # the request's own copy (it keeps per-step state)
        dtype, n = pipe.transformer.dtype, p.num_outputs
        text = {"device": self.device, "dtype": dtype, "batch_size": 1, "num_videos_per_prompt": n}
        embeds, mask, glyph, glyph_mask = pipe.encode_prompt(prompt=req.prompt, **text)
        cond = {
            "encoder_hidden_states": embeds,
            "encoder_attention_mask": mask,
            "encoder_hidden_states_2": glyph,
            "encoder_attention_mask_2": glyph_mask,
        }
        uncond = None
        if guider._enabled and guider.num_conditions > 1:
            n_embeds, n_mask, n_glyph, n_glyph_mask = pipe.encode_prompt(prompt=req.negative_prompt, **text)
            uncond = {
                "encoder_hidden_states": n_embeds,
                "encoder_attention_mask": n_mask,
                "encoder_hidden_states_2": n_glyph,
                "encoder_attention_mask_2": n_glyph_mask,
            }
        steps = p.num_inference_steps
        scheduler = self.private_scheduler()
        timesteps, _ = retrieve_timesteps(
            scheduler, steps, self.device, sigmas=np.linspace(1.0, 0.0, steps + 1)[:-1]
        )
        image, (height, width) = self._frame(req)
        image_embeds = self._image_embeds(image, n, dtype)
        latents = pipe.prepare_latents(
            n, pipe.num_channels_latents, height, width, p.num_frames, dtype, self.device, req.generator()
        )
        condition, condition_mask = self._condition(latents, image, (height, width), dtype)
        extra = {"guider": guider, "condition": torch.cat([condition, condition_mask], dim=1)}
        for branch in (cond, uncond):
            if branch is not None:
                branch["image_embeds"] = image_embeds
        return StepState(latents, timesteps, scheduler, cond, uncond, extra)

    def _frame(self, req: DiffusionRequest) -> tuple[Any, tuple[int, int]]:
        """(the image to start from, the video's (height, width)): text to video has no image."""
        return None, (req.params.height, req.params.width)

    def _image_embeds(self, image: Any, rows: int, dtype: torch.dtype) -> torch.Tensor:
        pipe = self.pipe
        shape = (rows, pipe.vision_num_semantic_tokens, pipe.vision_states_dim)
        return torch.zeros(shape, dtype=dtype, device=self.device)

    def _condition(
        self, latents: torch.Tensor, image: Any, size: tuple[int, int], dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The condition latents and their mask beside the latents (zeros: nothing to keep)."""
        return self.pipe.prepare_cond_latents_and_mask(latents, dtype, self.device)

    def branch_inputs(self, state: StepState) -> list[dict[str, Any]]:
        """The guider's branches at this step: the unconditional one only where it guides here."""
        guider = state.extra["guider"]
        t = state.timesteps[state.step_index]
        guider.set_state(step=state.step_index, num_inference_steps=state.total_steps, timestep=t)
        branches = super().branch_inputs(state)
        return branches if guider.num_conditions > 1 else branches[:1]

    def forward_groups(self, inputs: list[dict[str, Any]]) -> list[list[int]]:
        """Inputs of equal shapes share a forward (an image's aspect sets its video's size). On a CPU each
        branch runs alone, as the pipeline's guider runs them: its attention over the padded text takes a
        full mask, and two rows of it in one forward took 38% longer than the two apart (measured at 64x64,
        9 frames: a request 1.68 s against the plain call's 1.51 s; apart 1.33 s against 1.31 s)."""
        groups: dict[tuple, list[int]] = {}
        alone = self.device.type == "cpu"
        for i, branch in enumerate(inputs):
            key = (branch["hidden_states"].shape[1:], branch["image_embeds"].shape[1:], i if alone else None)
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        hidden = torch.cat([state.latents, state.extra["condition"]], dim=1)
        return {"hidden_states": hidden, "timestep": t.expand(state.rows).to(hidden.dtype)}

    def guide(self, state: StepState, cond: torch.Tensor, uncond: torch.Tensor | None) -> torch.Tensor:
        return state.extra["guider"].forward(cond, uncond).pred

    def decode(self, state: StepState) -> torch.Tensor:
        vae = self.pipe.vae
        video = vae.decode(state.latents.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0]
        return torch.as_tensor(self.pipe.video_processor.postprocess_video(video, output_type="np"))


class HunyuanVideo15I2VAdapter(HunyuanVideo15Adapter):
    """Image to video (`HunyuanVideo15ImageToVideoPipeline`): the video takes the image's aspect at the
    transformer's target size; its first latent frame is the image's (masked in), and the image's SigLIP
    embeddings condition every step."""

    needs_image = True

    def defaults(self) -> dict[str, Any]:
        return StepAdapter.defaults(self)  # the size comes from the image

    def _frame(self, req: DiffusionRequest) -> tuple[Any, tuple[int, int]]:
        pipe, image = self.pipe, req.images[0]
        height, width = pipe.video_processor.calculate_default_height_width(
            height=image.size[1], width=image.size[0], target_size=pipe.target_size
        )
        image = pipe.video_processor.resize(image, height=height, width=width, resize_mode="crop")
        return image, (height, width)

    def _image_embeds(self, image: Any, rows: int, dtype: torch.dtype) -> torch.Tensor:
        return self.pipe.encode_image(image=image, batch_size=rows, device=self.device, dtype=dtype)

    def _condition(
        self, latents: torch.Tensor, image: Any, size: tuple[int, int], dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rows = latents.shape[0]
        return self.pipe.prepare_cond_latents_and_mask(latents, image, rows, *size, dtype, self.device)
