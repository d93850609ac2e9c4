"""LTX-2's step adapters: `LTX2Pipeline.__call__` (text to a video with its own sound track) and
`LTX2ImageToVideoPipeline.__call__` split at their step boundaries (omnistage/stages/diffusion/adapters.py
says how the engine drives them).

One transformer forward denoises a clip's video latents and audio latents together, so both ride in every
branch input and come back packed into one row per output (`run_model`). The pipeline guides with up to
three weaker predictions beside the conditional one: the negative prompt's (CFG), one with attention
perturbed in some blocks (STG) and one with the audio↔video cross-attention cut (modality isolation). They
are the unconditional branch here, stacked in that order; each marks its rows with its pass, and `run_model`
runs each pass as its own forward over every request's rows of that pass. `guide` combines them as the
pipeline does, on x0 predictions, per modality (each with its own scales and rescale); each modality has
its own scheduler."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.families.shared.flow_match import shifted_timesteps
from omnistage.params import DiffusionParams
from omnistage.stages.diffusion.adapters import StepAdapter
from omnistage.stages.diffusion.request import DiffusionRequest, StepState, VideoWithAudio

TEXT, PERTURBED, ISOLATED = 0, 1, 2  # the forward passes: plain, STG-perturbed, modalities isolated
PASS_OF = {"cfg": TEXT, "stg": PERTURBED, "modality": ISOLATED}
LTX2_SHIFT = (1024, 4096, 0.95, 2.05)  # the pipeline's defaults for a scheduler config without them
# The call arguments a step-by-step request may set (`DiffusionParams.extra`); the others (precomputed
# latents or embeddings, prompt enhancement, a predicted duration) are served by whole calls only, and the
# clip's `frame_rate` is the request's `fps`.
STEP_ARGS = frozenset(
    {
        "motion_speed",
        "sigmas",
        "stg_scale",
        "modality_scale",
        "guidance_rescale",
        "audio_guidance_scale",
        "audio_stg_scale",
        "audio_modality_scale",
        "audio_guidance_rescale",
        "spatio_temporal_guidance_blocks",
        "noise_scale",
        "decode_timestep",
        "decode_noise_scale",
        "use_cross_timestep",
    }
)
# The transformer inputs that are one row per latent row (the rest is one value per forward).
ROW_INPUTS = (
    "hidden_states",
    "audio_hidden_states",
    "encoder_hidden_states",
    "audio_encoder_hidden_states",
    "encoder_attention_mask",
    "audio_encoder_attention_mask",
    "timestep",
    "audio_timestep",
    "sigma",
    "video_coords",
    "audio_coords",
)


@dataclasses.dataclass(frozen=True)
class Guidance:
    """One modality's guidance scales, as the pipeline resolves them."""

    cfg: float
    stg: float
    modality: float
    rescale: float


class LTX2Adapter(StepAdapter):
    """Text to video with sound (`LTX2Pipeline`)."""

    modality = "video"
    parallel_refused = "guides with passes that are not CFG's two branches (STG, modality isolation)"
    step_args = STEP_ARGS

    @property
    def spatial_multiple(self) -> int:
        return 32  # the pipeline's own rule (check_inputs)

    @property
    def temporal_factor(self) -> int:
        return self.pipe.vae_temporal_compression_ratio

    def default_fps(self) -> int:
        return int(self.call_signature["frame_rate"].default)

    def sample_rate(self) -> int:
        return int(self.pipe.vocoder.config.output_sampling_rate)

    def defaults(self) -> dict[str, Any]:
        """The pipeline's own; 121 frames where it has no duration head to predict them (LTX-2.0/2.3)."""
        out = super().defaults()
        if out.get("num_frames") is None:
            out["num_frames"] = 121
        return out

    def validate(self, p: DiffusionParams, images: list[Any]) -> None:
        super().validate(p, images)
        if "frame_rate" in p.extra:
            raise InvalidRequestError(
                f"extra: {self.class_name}'s frame_rate is the request's fps", param="extra"
            )
        refused = sorted(set(p.extra) - self.step_args)
        if refused:
            raise InvalidRequestError(
                f"extra: {refused[0]!r} is not served step by step for {self.class_name} "
                f"(its step-by-step arguments: {', '.join(sorted(self.step_args))})",
                param="extra",
            )
        video, audio = self._guidance(p)
        if (video.stg > 0 or audio.stg > 0) and not self._arg(p, "spatio_temporal_guidance_blocks"):
            raise InvalidRequestError(
                "extra: STG (stg_scale or audio_stg_scale > 0) needs spatio_temporal_guidance_blocks",
                param="extra",
            )

    def latent_tokens(self, req: DiffusionRequest) -> int:
        """Video and audio tokens, times the forwards' rows (the outputs and their guidance passes)."""
        p = req.params
        frames, height, width = self._latent_shape(p)
        audio = self._audio_frames(p)
        return (frames * height * width + audio) * p.num_outputs * (1 + len(_passes(self._guidance(p))))

    def step_batch_key(self, req: DiffusionRequest) -> tuple:
        """Same video and audio lengths (the clip's frame rate sets the audio's), same text length."""
        p = req.params
        return (p.height, p.width, p.num_frames, p.fps, p.max_sequence_length)

    # ---- the request's knobs
    def _arg(self, p: DiffusionParams, name: str) -> Any:
        """A call argument of the request, else the pipeline's default for it."""
        return p.extra[name] if name in p.extra else self.call_signature[name].default

    def _latent_shape(self, p: DiffusionParams) -> tuple[int, int, int]:
        spatial = self.pipe.vae_spatial_compression_ratio
        return (p.num_frames - 1) // self.temporal_factor + 1, p.height // spatial, p.width // spatial

    def _audio_frames(self, p: DiffusionParams) -> int:
        """Audio latent frames as long as the clip (`num_frames` at `fps`)."""
        pipe = self.pipe
        rate = (
            pipe.audio_sampling_rate
            / pipe.audio_hop_length
            / float(pipe.audio_vae_temporal_compression_ratio)
        )
        return round(p.num_frames / float(p.fps) * rate)

    def _guidance(self, p: DiffusionParams) -> tuple[Guidance, Guidance]:
        """(video, audio) scales: an audio scale left None (or 0) takes the video's, as the pipeline does."""
        video = Guidance(
            p.guidance_scale,
            self._arg(p, "stg_scale"),
            self._arg(p, "modality_scale"),
            self._arg(p, "guidance_rescale"),
        )
        audio = Guidance(
            self._arg(p, "audio_guidance_scale") or video.cfg,
            self._arg(p, "audio_stg_scale") or video.stg,
            self._arg(p, "audio_modality_scale") or video.modality,
            self._arg(p, "audio_guidance_rescale") or video.rescale,
        )
        return video, audio

    # ---- prepare
    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.ltx2.utils import conditioning_frame_rate

        pipe, p, device = self.pipe, req.params, self.device
        guidance = self._guidance(p)
        passes = _passes(guidance)
        n = p.num_outputs
        text = self._text(req, "cfg" in passes)
        generator = req.generator()
        latents, mask = self._video_latents(req, generator, text["encoder_hidden_states"].dtype)
        audio_latents = pipe.prepare_audio_latents(
            n,
            num_channels_latents=pipe.audio_vae.config.latent_channels,
            audio_latent_length=self._audio_frames(p),
            num_mel_bins=pipe.audio_vae.config.mel_bins,
            noise_scale=self._arg(p, "noise_scale"),
            dtype=torch.float32,
            device=device,
            generator=generator,
        )
        timesteps, scheduler, audio_scheduler = self._schedulers(p, latents.shape[1])

        fps = conditioning_frame_rate(float(p.fps), self._arg(p, "motion_speed"))
        rope = pipe.transformer.rope
        coords = {
            "video_coords": rope.prepare_video_coords(n, *self._latent_shape(p), device, fps=fps),
            "audio_coords": pipe.transformer.audio_rope.prepare_audio_coords(
                n, self._audio_frames(p), device
            ),
        }
        per_forward = {
            "stg_blocks": tuple(self._arg(p, "spatio_temporal_guidance_blocks") or ()),
            "use_cross_timestep": self._arg(p, "use_cross_timestep"),
        }
        prompt = {k: v[-n:] for k, v in text.items()}  # [negative rows, prompt rows] under CFG
        cond = {**prompt, **coords, "guidance_pass": torch.full((n,), TEXT), **per_forward}
        uncond = None
        if passes:  # the weaker passes, stacked: the negative prompt's, or the prompt's
            parts = [
                {**({k: v[:n] for k, v in text.items()} if name == "cfg" else prompt), **coords}
                for name in passes
            ]
            uncond = {k: torch.cat([part[k] for part in parts]) for k in parts[0]}
            uncond["guidance_pass"] = torch.cat([torch.full((n,), PASS_OF[name]) for name in passes])
            uncond.update(per_forward)
        extra = {
            "audio_latents": audio_latents,
            "audio_scheduler": audio_scheduler,
            "guidance": guidance,
            "passes": passes,
            "mask": mask,
            "generator": generator,  # the decoder's noise comes after the latents', from the same generator
            "decode": (self._arg(p, "decode_timestep"), self._arg(p, "decode_noise_scale")),
            "shape": self._latent_shape(p),
            "audio_shape": (
                self._audio_frames(p),
                pipe.audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio,
            ),
        }
        return StepState(latents, timesteps, scheduler, cond, uncond, extra)

    def _text(self, req: DiffusionRequest, cfg: bool) -> dict[str, torch.Tensor]:
        """The connectors' outputs as transformer inputs: [negative rows, prompt rows] under CFG, as the
        pipeline runs them (one mask serves both modalities)."""
        pipe, p = self.pipe, req.params
        embeds, mask, neg_embeds, neg_mask = pipe.encode_prompt(
            prompt=req.prompt,
            negative_prompt=req.negative_prompt,
            do_classifier_free_guidance=cfg,
            num_videos_per_prompt=p.num_outputs,
            max_sequence_length=p.max_sequence_length,
            device=self.device,
        )
        if cfg:
            embeds, mask = torch.cat([neg_embeds, embeds]), torch.cat([neg_mask, mask])
        side = getattr(pipe.tokenizer, "padding_side", "left") if pipe.tokenizer is not None else "left"
        video, audio, text_mask = pipe.connectors(embeds, mask, padding_side=side)
        return {
            "encoder_hidden_states": video,
            "audio_encoder_hidden_states": audio,
            "encoder_attention_mask": text_mask,
            "audio_encoder_attention_mask": text_mask,
        }

    def _video_latents(
        self, req: DiffusionRequest, generator: torch.Generator, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The packed video latents and, where frames are given (image to video), their conditioning mask."""
        p = req.params
        channels = self.pipe.transformer.config.in_channels
        noise_scale = self._arg(p, "noise_scale")
        args = (p.height, p.width, p.num_frames, noise_scale, torch.float32, self.device, generator)
        return self.pipe.prepare_latents(p.num_outputs, channels, *args), None

    def _schedulers(self, p: DiffusionParams, video_tokens: int) -> tuple[torch.Tensor, Any, Any]:
        """(timesteps, the video's scheduler, the audio's): private copies, at the pipeline's sigmas, both
        shifted by the video's length."""
        steps = p.num_inference_steps
        sigmas = self._arg(p, "sigmas")
        sigmas = np.linspace(1.0, 1 / steps, steps) if sigmas is None else sigmas
        video, timesteps = shifted_timesteps(self, video_tokens, steps, sigmas, LTX2_SHIFT)
        audio, _ = shifted_timesteps(self, video_tokens, steps, sigmas, LTX2_SHIFT)
        return timesteps, video, audio

    # ---- one step
    def step_inputs(self, state: StepState) -> dict[str, Any]:
        timestep = state.timesteps[state.step_index].expand(state.rows)
        return {
            "hidden_states": state.latents,
            "audio_hidden_states": state.extra["audio_latents"],
            "timestep": timestep,
            "sigma": timestep,  # read by LTX-2.3's prompt modulation
        }

    def branch_inputs(self, state: StepState) -> list[dict[str, Any]]:
        """The conditional branch, and the weaker passes stacked as the unconditional one (each on the
        same latents)."""
        common = self.step_inputs(state)
        branches = [{**common, **state.cond}]
        if state.uncond is not None:
            repeats = len(state.extra["passes"])
            stacked = {k: torch.cat([v] * repeats) for k, v in common.items()}
            branches.append({**stacked, **state.uncond})
        return branches

    def forward_groups(self, inputs: list[dict[str, Any]]) -> list[list[int]]:
        """Inputs of equal video, audio and text lengths and the same per-forward switches share a forward."""
        groups: dict[tuple, list[int]] = {}
        for i, branch in enumerate(inputs):
            key = (
                branch["hidden_states"].shape[1:],
                branch["audio_hidden_states"].shape[1:],
                branch["encoder_hidden_states"].shape[1:],
                branch["stg_blocks"],
                branch["use_cross_timestep"],
            )
            groups.setdefault(key, []).append(i)
        return list(groups.values())

    def run_model(self, module: torch.nn.Module, kwargs: dict[str, Any]) -> torch.Tensor:
        """One forward per guidance pass present; each row's video and audio predictions packed in one row."""
        passes = kwargs["guidance_pass"]
        outputs: list[torch.Tensor] | None = None
        for kind in passes.unique().tolist():
            rows = None if bool((passes == kind).all()) else (passes == kind).nonzero().squeeze(1)
            inputs = {k: kwargs[k] if rows is None else kwargs[k][rows] for k in ROW_INPUTS if k in kwargs}
            predictions = module(
                **inputs,
                isolate_modalities=kind == ISOLATED,
                spatio_temporal_guidance_blocks=list(kwargs["stg_blocks"]) if kind == PERTURBED else None,
                perturbation_mask=None,
                use_cross_timestep=kwargs["use_cross_timestep"],
                return_dict=False,
            )
            if rows is None:
                outputs = list(predictions)
                break
            if outputs is None:
                outputs = [x.new_empty((passes.shape[0], *x.shape[1:])) for x in predictions]
            for out, x in zip(outputs, predictions, strict=True):
                out[rows] = x
        return torch.cat([x.float().flatten(1) for x in outputs], dim=1)

    def guide(self, state: StepState, cond: torch.Tensor, uncond: torch.Tensor | None) -> tuple:
        """The pipeline's guidance on x0 predictions, per modality; back to velocities for the schedulers."""
        from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

        i, extra = state.step_index, state.extra
        latents = (state.latents, extra["audio_latents"])
        sigmas = (state.scheduler.sigmas[i], extra["audio_scheduler"].sigmas[i])

        def x0(packed: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(x - v * s for x, v, s in zip(latents, _unpack(packed, latents), sigmas, strict=True))

        passes = extra["passes"]
        weaker = dict(zip(passes, map(x0, uncond.chunk(len(passes))), strict=True)) if passes else {}
        velocities = []
        for m, (x, sigma, g, positive) in enumerate(
            zip(latents, sigmas, extra["guidance"], x0(cond), strict=True)
        ):
            cfg = (g.cfg - 1) * (positive - weaker["cfg"][m]) if "cfg" in weaker else 0
            stg = g.stg * (positive - weaker["stg"][m]) if "stg" in weaker else 0
            isolated = (g.modality - 1) * (positive - weaker["modality"][m]) if "modality" in weaker else 0
            guided = positive + cfg + stg + isolated
            if g.rescale > 0:
                guided = rescale_noise_cfg(guided, positive, guidance_rescale=g.rescale)
            velocities.append((x - guided) / sigma)
        return tuple(velocities)

    def advance(self, state: StepState, noise_pred: tuple) -> None:
        video, audio = noise_pred
        t, extra = state.timesteps[state.step_index], state.extra
        state.latents = self._step_video(state, video, t)
        extra["audio_latents"] = extra["audio_scheduler"].step(
            audio, t, extra["audio_latents"], return_dict=False
        )[0]
        state.step_index += 1

    def _step_video(self, state: StepState, velocity: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return state.scheduler.step(velocity, t, state.latents, return_dict=False)[0]

    # ---- decode
    def decode(self, state: StepState) -> VideoWithAudio:
        """Video VAE → frames; audio VAE → mel spectrogram → vocoder → waveform."""
        pipe, extra = self.pipe, state.extra
        latents = self._unpacked(state.latents, extra["shape"])
        vae = pipe.vae
        timestep = None
        if vae.config.timestep_conditioning:
            latents, timestep = self._decode_noise(latents, *extra["decode"], extra["generator"])
        latents = pipe._denormalize_latents(
            latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor
        )
        video = vae.decode(latents.to(vae.dtype), timestep, return_dict=False)[0]
        frames = torch.as_tensor(pipe.video_processor.postprocess_video(video, output_type="np"))

        audio_vae = pipe.audio_vae
        audio = pipe._denormalize_audio_latents(
            extra["audio_latents"], audio_vae.latents_mean, audio_vae.latents_std
        )
        audio = pipe._unpack_audio_latents(audio, *extra["audio_shape"])
        mel = audio_vae.decode(audio.to(audio_vae.dtype), return_dict=False)[0]
        return VideoWithAudio(frames, pipe.vocoder(mel).float(), self.sample_rate())

    def _unpacked(self, latents: torch.Tensor, shape: tuple[int, int, int]) -> torch.Tensor:
        pipe = self.pipe
        patch, patch_t = pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
        return pipe._unpack_latents(latents, *shape, patch, patch_t)

    @staticmethod
    def _decode_noise(
        latents: torch.Tensor, decode_timestep: Any, noise_scale: Any, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A timestep-conditioned VAE decodes latents noised at its decode timestep (one prompt's values)."""
        from diffusers.utils.torch_utils import randn_tensor

        noise = randn_tensor(latents.shape, generator=generator, device=latents.device, dtype=latents.dtype)
        decode_timestep = decode_timestep if isinstance(decode_timestep, list) else [decode_timestep]
        noise_scale = decode_timestep if noise_scale is None else noise_scale
        noise_scale = noise_scale if isinstance(noise_scale, list) else [noise_scale]
        like = {"device": latents.device, "dtype": latents.dtype}
        scale = torch.tensor(noise_scale, **like)[:, None, None, None, None]
        return (1 - scale) * latents + scale * noise, torch.tensor(decode_timestep, **like)

    # ---- request mode (whole calls)
    def call_kwargs(self, reqs: list[DiffusionRequest]) -> dict[str, Any]:
        return {**super().call_kwargs(reqs), "frame_rate": float(reqs[0].params.fps)}

    def split_output(self, result: Any, reqs: list[DiffusionRequest]) -> list[VideoWithAudio]:
        frames = super().split_output(result, reqs)
        audio = result.audio.float().split([r.params.num_outputs for r in reqs])
        return [VideoWithAudio(f, a, self.sample_rate()) for f, a in zip(frames, audio, strict=True)]


class LTX2I2VAdapter(LTX2Adapter):
    """Image to video with sound (`LTX2ImageToVideoPipeline`): the image, re-compressed as the model was
    trained (H.264 at its CRF) and resized to the clip, is the first latent frame. Its tokens denoise at
    timestep 0 and the scheduler steps only the frames after it."""

    needs_image = True
    step_args = STEP_ARGS | {"image_crf"}

    def _video_latents(
        self, req: DiffusionRequest, generator: torch.Generator, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import PIL.Image
        from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf, resolve_default_image_crf

        pipe, p = self.pipe, req.params
        image, crf = req.images[0], self._arg(p, "image_crf")
        crf = resolve_default_image_crf(pipe.text_encoder) if crf is None else crf
        if crf != 0:
            image = PIL.Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), crf))
        image = pipe.video_processor.preprocess(image, height=p.height, width=p.width)
        image = image.to(device=self.device, dtype=dtype)
        channels = pipe.transformer.config.in_channels
        noise_scale = self._arg(p, "noise_scale")
        args = (p.height, p.width, p.num_frames, noise_scale, torch.float32, self.device, generator)
        return pipe.prepare_latents(image, p.num_outputs, channels, *args)

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        """The video's timestep per token (0 on the image's), the audio's per row."""
        inputs = super().step_inputs(state)
        timestep = inputs["timestep"]
        inputs["timestep"] = timestep.unsqueeze(-1) * (1 - state.extra["mask"])
        inputs["audio_timestep"] = timestep
        return inputs

    def _step_video(self, state: StepState, velocity: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        shape = state.extra["shape"]
        latents = self._unpacked(state.latents, shape)
        velocity = self._unpacked(velocity, shape)[:, :, 1:]
        stepped = state.scheduler.step(velocity, t, latents[:, :, 1:], return_dict=False)[0]
        pipe = self.pipe
        latents = torch.cat([latents[:, :, :1], stepped], dim=2)
        return pipe._pack_latents(
            latents, pipe.transformer_spatial_patch_size, pipe.transformer_temporal_patch_size
        )


def _passes(guidance: tuple[Guidance, Guidance]) -> list[str]:
    """The weaker predictions a request is guided away from, in the order they are stacked."""
    video, audio = guidance
    passes = []
    if video.cfg > 1.0 or audio.cfg > 1.0:
        passes.append("cfg")
    if video.stg > 0.0 or audio.stg > 0.0:
        passes.append("stg")
    if video.modality > 1.0 or audio.modality > 1.0:
        passes.append("modality")
    return passes


def _unpack(
    packed: torch.Tensor, like: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed output row back into (video, audio) predictions shaped like the latents."""
    video, audio = like
    split = video[0].numel()
    return packed[:, :split].reshape(video.shape), packed[:, split:].reshape(audio.shape)
