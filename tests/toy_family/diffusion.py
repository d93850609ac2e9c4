"""Stable Diffusion 1.x on the diffusion engine, step by step: the toy family's step adapter (the engine
drives `StableDiffusionPipeline.__call__`'s loop itself, stages/diffusion/adapters.py) and a tiny random
checkpoint of its real classes, built locally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.cache import cached_dir
from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState


class StableDiffusionAdapter(StepAdapter):
    """A UNet denoiser (its latents are the forward's `sample`), classic CFG over CLIP embeddings."""

    modality = "image"
    cfg_in_batch = True
    latent_input = "sample"

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps

        pipe, p = self.pipe, req.params
        do_cfg = p.guidance_scale > 1
        embeds, negative = pipe.encode_prompt(
            req.prompt, self.device, p.num_outputs, do_cfg, negative_prompt=req.negative_prompt
        )
        scheduler = self.private_scheduler()
        timesteps, _ = retrieve_timesteps(scheduler, p.num_inference_steps, self.device)
        latents = pipe.prepare_latents(
            p.num_outputs,
            pipe.unet.config.in_channels,
            p.height,
            p.width,
            embeds.dtype,
            self.device,
            req.generator(),
            None,
        )
        cond = {"encoder_hidden_states": embeds}
        uncond = {"encoder_hidden_states": negative} if do_cfg else None
        return StepState(latents, timesteps, scheduler, cond, uncond, {"guidance": p.guidance_scale})

    def model_name(self, state: StepState) -> str:
        return "unet"

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        return {
            "sample": state.scheduler.scale_model_input(state.latents, t),
            "timestep": t.expand(state.rows),
        }

    def decode(self, state: StepState) -> torch.Tensor:
        vae = self.pipe.vae
        image = vae.decode(state.latents / vae.config.scaling_factor, return_dict=False)[0]
        return torch.as_tensor(self.pipe.image_processor.postprocess(image, output_type="np"))


def toy_sd_dir() -> Path:
    """A tiny random `StableDiffusionPipeline` (UNet, KL VAE, CLIP text encoder, DDIM), 32x32 images."""
    return cached_dir("toy-sd", "2", build_toy_sd)


def build_toy_sd(path: Path) -> None:
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    from omnistage.families.shared import tokenizer_builders as toks

    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32,
        attention_head_dim=4,
        norm_num_groups=4,
    )
    vae = AutoencoderKL(
        block_out_channels=[8, 16],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 2,
        up_block_types=["UpDecoderBlock2D"] * 2,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=32,
    )
    text = CLIPTextConfig(
        vocab_size=49408,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=toks.CLIP_BOS_ID,
        eos_token_id=toks.CLIP_EOS_ID,
        pad_token_id=toks.CLIP_EOS_ID,
    )
    scheduler = DDIMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=CLIPTextModel(text).eval(),
        tokenizer=toks.clip_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(path)
