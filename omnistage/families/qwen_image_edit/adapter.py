"""Qwen-Image-Edit's step adapters: `QwenImageEditPipeline.__call__` and `QwenImageEditPlusPipeline.__call__`
split at their step boundaries (omnistage/stages/diffusion/adapters.py says how the engine drives them).

Both are Qwen-Image (`QwenImageAdapter`: masked text, true CFG with norm rescaling, the same VAE decode) with
images to edit: the prompt is encoded by the Qwen2.5-VL text encoder together with the image(s), and the
images' VAE latents follow the noisy latents in every forward (the transformer's output over them is
dropped). The transformer places every row by the first row's `img_shapes`, so only requests whose output
and image shapes are equal share a forward; text of different lengths is padded and masked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.families.qwen_image.adapter import QwenImageAdapter
from omnistage.families.shared.flow_match import guidance_embedding, shifted_timesteps
from omnistage.params import DiffusionParams
from omnistage.stages.diffusion.request import DiffusionRequest, StepState

OUTPUT_AREA = 1024 * 1024  # the pipelines' default output area (and Edit's image area), in pixels


@dataclasses.dataclass
class EditImages:
    """A request's images as its pipeline prepares them for `encode_prompt(image=...)` (`condition`: PIL) and
    for `prepare_latents` (`vae`: `[1, 3, 1, H, W]`, a list of them for Edit-Plus), with the VAE images'
    `sizes` ((width, height) each, for `img_shapes`)."""

    condition: Any
    vae: Any
    sizes: list[tuple[int, int]]


class QwenImageEditAdapter(QwenImageAdapter):
    """Qwen-Image-Edit (`QwenImageEditPipeline`): one image, at about 1024x1024 pixels for both encoders."""

    needs_image = True
    max_images: int | None = 1

    def resolve(self, params: DiffusionParams | None, images: list[Any]) -> DiffusionParams:
        """The output size defaults to the pipeline's: the last image's aspect ratio (Edit-Plus sizes by its
        last image; Edit has one) at 1024x1024 pixels, in multiples of the packed latent."""
        params = params or DiffusionParams()
        if images and (params.height is None or params.width is None):
            width, height = self._area_size(images[-1], OUTPUT_AREA)
            multiple = self.spatial_multiple
            params = msgspec.structs.replace(
                params,
                height=params.height or height // multiple * multiple,
                width=params.width or width // multiple * multiple,
            )
        return super().resolve(params, images)

    def validate(self, p: DiffusionParams, images: list[Any]) -> None:
        super().validate(p, images)
        if self.max_images is not None and len(images) > self.max_images:
            raise InvalidRequestError(
                f"image: {self.class_name} edits one image, got {len(images)}", param="image"
            )

    @staticmethod
    def _area_size(image: Any, area: int) -> tuple[int, int]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        width, height, _ = calculate_dimensions(area, image.size[0] / image.size[1])
        return width, height

    def edit_images(self, images: list[Any]) -> EditImages:
        """The image resized to about 1024x1024 pixels; the VL encoder sees it as the VAE does."""
        processor = self.pipe.image_processor
        [(width, height)] = self._vae_sizes(images)
        resized = processor.resize(images[0], height, width)
        vae = processor.preprocess(resized, height, width).unsqueeze(2)
        return EditImages(resized, vae, [(width, height)])

    def prepare(self, req: DiffusionRequest) -> StepState:
        pipe, p = self.pipe, req.params
        k, msl = p.num_outputs, p.max_sequence_length
        images = self.edit_images(req.images)
        text = {"image": images.condition, "device": self.device, "num_images_per_prompt": k}
        embeds, mask = pipe.encode_prompt(prompt=req.prompt, max_sequence_length=msl, **text)
        uncond = None
        if p.true_cfg_scale > 1 and req.negative_prompt is not None:
            n_embeds, n_mask = pipe.encode_prompt(prompt=req.negative_prompt, max_sequence_length=msl, **text)
            uncond = {"encoder_hidden_states": n_embeds, "encoder_hidden_states_mask": n_mask}
        latents, image_latents = pipe.prepare_latents(
            images.vae,
            k,
            pipe.transformer.config.in_channels // 4,
            p.height,
            p.width,
            embeds.dtype,
            self.device,
            req.generator(),
        )
        n = p.num_inference_steps
        scheduler, timesteps = shifted_timesteps(self, latents.shape[1], n, np.linspace(1.0, 1 / n, n))
        packed = pipe.vae_scale_factor * 2
        shapes = [(1, p.height // packed, p.width // packed)]
        shapes += [(1, height // packed, width // packed) for width, height in images.sizes]
        cond = {"encoder_hidden_states": embeds, "encoder_hidden_states_mask": mask}
        extra = {
            "guidance": p.true_cfg_scale,
            "guidance_embed": guidance_embedding(self, p.guidance_scale, k),
            "image_latents": image_latents,
            "img_shapes": shapes,
            "height": p.height,
            "width": p.width,
        }
        return StepState(latents, timesteps, scheduler, cond, uncond, extra)

    def latent_tokens(self, req: DiffusionRequest) -> int:
        """The output's tokens and the images' (every forward carries both), for each row and branch."""
        p, packed = req.params, self.spatial_multiple
        tokens = (p.height // packed) * (p.width // packed)
        tokens += sum((height // packed) * (width // packed) for width, height in self._vae_sizes(req.images))
        branches = 2 if (p.true_cfg_scale or 0) > 1 and p.negative_prompt is not None else 1
        return tokens * p.num_outputs * branches

    def _vae_sizes(self, images: list[Any]) -> list[tuple[int, int]]:
        return [self._area_size(images[0], OUTPUT_AREA)] if images else []

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        return {
            "hidden_states": torch.cat([state.latents, state.extra["image_latents"]], dim=1),
            "timestep": t.expand(state.rows).to(state.latents.dtype) / 1000,
            "guidance": state.extra["guidance_embed"],
            "img_shapes": [state.extra["img_shapes"]] * state.rows,
        }

    def forward_groups(self, inputs: list[dict[str, Any]]) -> list[list[int]]:
        """Inputs with equal output and image shapes share a forward (RoPE follows the first row's)."""
        groups: dict[tuple, list[int]] = {}
        for i, branch in enumerate(inputs):  # (shapes may arrive as lists from a CFG-parallel rank)
            groups.setdefault(tuple(tuple(shape) for shape in branch["img_shapes"][0]), []).append(i)
        return list(groups.values())

    def guide(self, state: StepState, cond: torch.Tensor, uncond: torch.Tensor | None) -> torch.Tensor:
        length = state.latents.shape[1]  # the images' tokens are not predicted
        return super().guide(state, cond[:, :length], None if uncond is None else uncond[:, :length])


class QwenImageEditPlusAdapter(QwenImageEditAdapter):
    """Qwen-Image-Edit-Plus (`QwenImageEditPlusPipeline`): several images, each seen by the VL encoder at
    about 384x384 pixels and by the VAE at about 1024x1024; the output follows the last image's shape."""

    max_images = None

    @staticmethod
    def _area_size(image: Any, area: int) -> tuple[int, int]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions

        return calculate_dimensions(area, image.size[0] / image.size[1])

    def edit_images(self, images: list[Any]) -> EditImages:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import CONDITION_IMAGE_SIZE

        processor, condition, vae = self.pipe.image_processor, [], []
        sizes = self._vae_sizes(images)
        for image, (width, height) in zip(images, sizes, strict=True):
            c_width, c_height = self._area_size(image, CONDITION_IMAGE_SIZE)
            condition.append(processor.resize(image, c_height, c_width))
            vae.append(processor.preprocess(image, height, width).unsqueeze(2))
        return EditImages(condition, vae, sizes)

    def _vae_sizes(self, images: list[Any]) -> list[tuple[int, int]]:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import VAE_IMAGE_SIZE

        return [self._area_size(image, VAE_IMAGE_SIZE) for image in images]
