"""Stable Audio's step adapter: `StableAudioPipeline.__call__` split at its step boundaries (omnistage/stages/
diffusion/adapters.py says how the engine drives it). The clip's length (`audio_end_in_s`, from the request's
`audio_length`) reaches the DiT as a duration embedding; the latent length is the model's own, so requests
of any length share forwards, and each is cut to its length when decoded."""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState


class StableAudioAdapter(StepAdapter):
    """Stable Audio Open (`StableAudioPipeline`): T5 text and start/end-second embeddings, CFG over them."""

    modality = "audio"
    shared_inputs = frozenset({"rotary_embedding"})  # one (cos, sin) pair: every latent has the same length

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.models.embeddings import get_1d_rotary_pos_embed

        pipe, p = self.pipe, req.params
        start, end = self._span(p.extra)
        do_cfg = p.guidance_scale > 1.0
        negative = req.negative_prompt
        embeds = pipe.encode_prompt(req.prompt, self.device, do_cfg, negative)
        seconds_start, seconds_end = pipe.encode_duration(
            start, end, self.device, do_cfg and negative is not None, 1
        )
        text = torch.cat([embeds, seconds_start, seconds_end], dim=1)
        duration = torch.cat([seconds_start, seconds_end], dim=2)
        if do_cfg and negative is None:  # the pipeline's unconditional branch: zeros
            text = torch.cat([torch.zeros_like(text), text])
            duration = torch.cat([duration, duration])
        n = p.num_outputs
        text = text.repeat(1, n, 1).view(text.shape[0] * n, text.shape[1], text.shape[2])
        duration = duration.repeat(1, n, 1).view(duration.shape[0] * n, -1, duration.shape[-1])
        scheduler = self.private_scheduler()
        scheduler.set_timesteps(p.num_inference_steps, device=self.device)
        generator = req.generator()
        latents = pipe.prepare_latents(
            n,
            pipe.transformer.config.in_channels,
            int(pipe.transformer.config.sample_size),
            text.dtype,
            self.device,
            generator,
            None,
            None,
            n,
            audio_channels=pipe.vae.config.audio_channels,
        )
        rotary = get_1d_rotary_pos_embed(
            pipe.rotary_embed_dim,
            latents.shape[2] + duration.shape[1],
            use_real=True,
            repeat_interleave_real=False,
        )
        rate = pipe.vae.config.sampling_rate
        extra = {
            "guidance": p.guidance_scale,
            "step_kwargs": pipe.prepare_extra_step_kwargs(generator, 0.0),
            "span": (int(start * rate), int(end * rate)),
        }
        if do_cfg:  # [uncond rows, cond rows], as the pipeline orders them
            uncond_text, cond_text = text.chunk(2)
            uncond_duration, cond_duration = duration.chunk(2)
            cond = {"encoder_hidden_states": cond_text, "global_hidden_states": cond_duration}
            uncond = {"encoder_hidden_states": uncond_text, "global_hidden_states": uncond_duration}
        else:
            cond, uncond = {"encoder_hidden_states": text, "global_hidden_states": duration}, None
        for branch in (cond, uncond):
            if branch is not None:
                branch["rotary_embedding"] = rotary
        return StepState(latents, scheduler.timesteps, scheduler, cond, uncond, extra)

    def _span(self, extra: dict[str, Any]) -> tuple[float, float]:
        """(start, end) in seconds: the request's, else the pipeline's (from 0 to the longest clip)."""
        pipe = self.pipe
        longest = pipe.transformer.config.sample_size * pipe.vae.hop_length / pipe.vae.config.sampling_rate
        start = float(extra.get("audio_start_in_s") or 0.0)
        end = extra.get("audio_end_in_s")
        end = longest if end is None else float(end)
        if end - start > longest:
            raise InvalidRequestError(
                f"audio_length: at most {longest:g} s (this model's longest clip), got {end - start:g} s",
                param="audio_length",
            )
        return start, end

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        t = state.timesteps[state.step_index]
        return {
            "hidden_states": state.scheduler.scale_model_input(state.latents, t),
            "timestep": t.expand(state.rows),
        }

    def advance(self, state: StepState, noise_pred: torch.Tensor) -> None:
        t = state.timesteps[state.step_index]
        step = state.scheduler.step(noise_pred, t, state.latents, **state.extra["step_kwargs"])
        state.latents = step.prev_sample
        state.step_index += 1

    def decode(self, state: StepState) -> torch.Tensor:
        audio = self.pipe.vae.decode(state.latents).sample
        first, last = state.extra["span"]
        return audio[:, :, first:last].float()
