"""Family adapters: what the engine needs to know about one diffusers pipeline class.

`PipelineAdapter` serves any pipeline as whole calls (request mode): it resolves defaults from the
pipeline's own `__call__` signature, validates a request against the model's rules, and maps a batch of
compatible requests onto one call with one generator per request.

`StepAdapter` subclasses split a family's `__call__` at its step boundaries, reusing the pipeline's own
helpers (`encode_prompt`, `prepare_latents`, its VAE and post-processor): `prepare` (encode, latents,
a private scheduler), `branch_inputs` (the transformer inputs of one denoise step), `guide` (CFG combine)
and `decode`. The runner concatenates branch inputs of many requests into one transformer forward, so
requests at different steps share it; each family's `prepare`/`guide`/`decode` follow its diffusers
`__call__` line by line, so a request's result equals a plain pipeline call for the same seed.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import random
from typing import Any

import msgspec
import numpy as np
import torch

from omnistage import media
from omnistage.errors import InvalidRequestError
from omnistage.params import DiffusionParams
from omnistage.stages.diffusion.modality import pipeline_modality
from omnistage.stages.diffusion.request import DiffusionRequest, StepState

# Knobs the engine maps itself; `params.extra` may not smuggle them in.
MANAGED_CALL_ARGS = {
    "prompt",
    "negative_prompt",
    "height",
    "width",
    "num_frames",
    "num_inference_steps",
    "guidance_scale",
    "guidance_scale_2",
    "true_cfg_scale",
    "max_sequence_length",
    "generator",
    "output_type",
    "return_dict",
    "image",
    "latents",
    "num_images_per_prompt",
    "num_videos_per_prompt",
    "num_waveforms_per_prompt",
    "callback_on_step_end",
    "callback_on_step_end_tensor_inputs",
    "prompt_embeds",
    "negative_prompt_embeds",
}
PER_PROMPT_ARGS = ("num_images_per_prompt", "num_videos_per_prompt", "num_waveforms_per_prompt")
OUTPUT_FORMATS = {
    "image": ("png", "jpeg", "webp", "tensor"),
    "video": ("mp4", "tensor"),
    "audio": ("wav", "tensor"),
}
DEFAULT_LIMITS = {
    "max_pixels": 4096 * 4096,
    "max_num_frames": 1025,
    "max_inference_steps": 1000,
    "max_outputs": 16,
}


def _fail(param: str, rule: str) -> None:
    raise InvalidRequestError(f"{param} {rule}", param=param)


def _digest(images: list[Any]) -> str:
    h = hashlib.sha1()
    for image in images:
        h.update(np.asarray(image).tobytes())
    return h.hexdigest()


class PipelineAdapter:
    """Any diffusers pipeline, served as whole `pipe(...)` calls."""

    supports_steps = False
    needs_image = False
    # Spatial multiple for height/width; None: read the pipeline's VAE scale factor.
    size_multiple: int | None = None

    def __init__(self, pipe: Any, limits: dict[str, int] | None = None):
        self.pipe = pipe
        self.class_name = type(pipe).__name__
        self.modality = pipeline_modality(self.class_name)
        self.limits = {**DEFAULT_LIMITS, **(limits or {})}
        self.call_signature = inspect.signature(type(pipe).__call__).parameters
        self.accepts_image = "image" in self.call_signature

    # ---- rules and defaults
    @property
    def device(self) -> torch.device:
        return self.pipe._execution_device

    @property
    def spatial_multiple(self) -> int | None:
        if self.size_multiple is not None:
            return self.size_multiple
        factor = getattr(self.pipe, "vae_scale_factor", None) or getattr(
            self.pipe, "vae_scale_factor_spatial", None
        )
        return int(factor) if factor else None

    @property
    def temporal_factor(self) -> int | None:
        """Video families whose VAE compresses time need num_frames = k * factor + 1."""
        return None

    def default_fps(self) -> int:
        return 16

    def sample_rate(self) -> int | None:
        vae = getattr(self.pipe, "vae", None)
        return getattr(getattr(vae, "config", None), "sampling_rate", None)

    def defaults(self) -> dict[str, Any]:
        """The pipeline's own defaults, read from its `__call__` signature."""
        out = {}
        for name in (
            "height",
            "width",
            "num_frames",
            "num_inference_steps",
            "guidance_scale",
            "true_cfg_scale",
            "max_sequence_length",
        ):
            param = self.call_signature.get(name)
            if param is not None and param.default is not inspect.Parameter.empty:
                out[name] = param.default
        sample = getattr(self.pipe, "default_sample_size", None)
        factor = getattr(self.pipe, "vae_scale_factor", None)
        for name in ("height", "width"):
            if out.get(name) is None and name in self.call_signature and sample and factor:
                out[name] = int(sample * factor)
        if self.modality == "video":
            out["fps"] = self.default_fps()
        return out

    def resolve(self, params: DiffusionParams | None, images: list[Any]) -> DiffusionParams:
        """`params` with the pipeline's defaults filled in, checked against this model's rules."""
        params = params or DiffusionParams()
        filled = {k: v for k, v in self.defaults().items() if getattr(params, k, None) is None}
        if params.seed is None:
            filled["seed"] = random.SystemRandom().randrange(2**31)
        params = msgspec.structs.replace(params, **filled)
        self.validate(params, images)
        return params

    def validate(self, p: DiffusionParams, images: list[Any]) -> None:
        multiple = self.spatial_multiple
        for name in ("height", "width"):
            value = getattr(p, name)
            if value is None:
                continue
            if name not in self.call_signature:
                _fail(name, f"is not supported by {self.class_name}")
            if multiple and value % multiple:
                _fail(name, f"must be a multiple of {multiple} for {self.class_name}, got {value}")
        if p.height and p.width and p.height * p.width > self.limits["max_pixels"]:
            _fail("height", f"height*width must be <= {self.limits['max_pixels']} pixels")
        self._validate_frames(p)
        if p.num_inference_steps is not None and p.num_inference_steps > self.limits["max_inference_steps"]:
            _fail("num_inference_steps", f"must be <= {self.limits['max_inference_steps']}")
        if p.num_outputs > self.limits["max_outputs"]:
            _fail("num_outputs", f"must be <= {self.limits['max_outputs']}")
        if p.num_outputs > 1 and not any(a in self.call_signature for a in PER_PROMPT_ARGS):
            _fail("num_outputs", f"must be 1 for {self.class_name}")
        for name in ("true_cfg_scale", "guidance_scale_2"):
            if getattr(p, name) is not None and not self._supports(name):
                _fail(name, f"is not supported by {self.class_name}")
        if p.negative_prompt is not None and "negative_prompt" not in self.call_signature:
            _fail("negative_prompt", f"is not supported by {self.class_name}")
        if images and not self.accepts_image:
            _fail("image", f"is not accepted by {self.class_name} (it takes no input image)")
        if p.mask is not None and "mask_image" not in self.call_signature:
            _fail("mask", f"is not accepted by {self.class_name} (it does no inpainting)")
        if self.needs_image and not images:
            _fail("image", f"is required by {self.class_name}")
        if p.output_format is not None and p.output_format not in self._formats(p):
            _fail("output_format", f"must be one of {', '.join(self._formats(p))} for {self.modality} output")
        bad = sorted(set(p.extra) & MANAGED_CALL_ARGS) or sorted(set(p.extra) - set(self.call_signature))
        if bad:
            _fail("extra", f"may only hold other {self.class_name} call arguments; {bad[0]!r} is not allowed")

    def _validate_frames(self, p: DiffusionParams) -> None:
        if p.num_frames is None:
            return
        if "num_frames" not in self.call_signature:
            if p.num_frames != 1:
                _fail("num_frames", f"must be 1 for {self.class_name} (an image model)")
            return
        factor = self.temporal_factor
        if factor and (p.num_frames - 1) % factor:
            _fail(
                "num_frames",
                f"must be {factor}*k+1 for {self.class_name} (e.g. 1, 5, 9, 81), got {p.num_frames}",
            )
        if p.num_frames > self.limits["max_num_frames"]:
            _fail("num_frames", f"must be <= {self.limits['max_num_frames']}")

    def _supports(self, name: str) -> bool:
        return name in self.call_signature

    def _formats(self, p: DiffusionParams) -> tuple[str, ...]:
        if self.modality == "video" and p.num_frames == 1:
            return OUTPUT_FORMATS["image"] + ("mp4",)
        return OUTPUT_FORMATS[self.modality]

    # ---- request mode
    def request_batch_key(self, req: DiffusionRequest) -> tuple:
        """Requests with equal keys run as one pipeline call. A request with several outputs runs alone: one
        generator drawing all its latents cannot be split into per-row generators of a batched call."""
        p = req.params
        solo = req.request_id if p.num_outputs > 1 else None
        image = _digest(req.images) if req.images else None
        if p.mask is not None:
            solo = req.request_id  # an inpainting mask belongs to one request
        return (
            p.height,
            p.width,
            p.num_frames,
            p.num_inference_steps,
            p.guidance_scale,
            p.guidance_scale_2,
            p.true_cfg_scale,
            p.max_sequence_length,
            p.negative_prompt is not None,
            p.cache,
            json.dumps(p.cache_options, sort_keys=True, default=str),
            json.dumps(p.extra, sort_keys=True, default=str),
            image,
            solo,
        )

    def call_kwargs(self, reqs: list[DiffusionRequest]) -> dict[str, Any]:
        """One `pipe(...)` call for compatible requests. A single request is passed exactly as a user would
        (scalar prompt, one generator), so request mode equals the plain call bit for bit."""
        p, solo = reqs[0].params, len(reqs) == 1
        kwargs: dict[str, Any] = {"prompt": reqs[0].prompt if solo else [r.prompt for r in reqs]}
        if p.negative_prompt is not None:
            negatives = [r.negative_prompt for r in reqs]
            kwargs["negative_prompt"] = negatives[0] if solo else negatives
        for name in (
            "height",
            "width",
            "num_frames",
            "num_inference_steps",
            "guidance_scale",
            "guidance_scale_2",
            "true_cfg_scale",
            "max_sequence_length",
        ):
            if name in self.call_signature and getattr(p, name) is not None:
                kwargs[name] = getattr(p, name)
        per_prompt = next((a for a in PER_PROMPT_ARGS if a in self.call_signature), None)
        if per_prompt:
            kwargs[per_prompt] = p.num_outputs
        kwargs["generator"] = reqs[0].generator() if solo else [r.generator() for r in reqs]
        if reqs[0].images:
            kwargs["image"] = reqs[0].images[0] if len(reqs[0].images) == 1 else reqs[0].images
        if p.mask is not None:
            kwargs["mask_image"] = media.decode_image(p.mask)
        if "output_type" in self.call_signature:
            kwargs["output_type"] = "np"
        kwargs.update(p.extra)
        return kwargs

    def split_output(self, result: Any, reqs: list[DiffusionRequest]) -> list[torch.Tensor]:
        """The call's output rows, per request: float `[k, H, W, 3]` images, `[k, F, H, W, 3]` video or
        `[k, C, N]` audio."""
        for attr in ("frames", "images", "audios", "audio"):
            data = getattr(result, attr, None)
            if data is not None:
                break
        else:
            raise RuntimeError(f"{self.class_name} returned no frames/images/audios")
        if isinstance(data, list):
            data = np.stack([np.asarray(d) for d in data])
        tensor = torch.as_tensor(np.asarray(data) if not isinstance(data, torch.Tensor) else data).float()
        return list(tensor.split([r.params.num_outputs for r in reqs]))

    # ---- step mode (families that support it override)
    def latent_tokens(self, req: DiffusionRequest) -> int:
        """Transformer tokens one request puts into a forward (all its rows and CFG branches)."""
        p = req.params
        multiple = self.spatial_multiple or 1
        tokens = (p.height or multiple) // multiple * ((p.width or multiple) // multiple)
        if self.temporal_factor and p.num_frames:
            tokens *= (p.num_frames - 1) // self.temporal_factor + 1
        cfg = (p.guidance_scale or 0) > 1 or ((p.true_cfg_scale or 0) > 1 and p.negative_prompt is not None)
        return tokens * p.num_outputs * (2 if cfg else 1)

    def step_batch_key(self, req: DiffusionRequest) -> tuple:
        """Requests with equal keys can share one transformer forward (same latent and text shapes)."""
        p = req.params
        return (p.height, p.width, p.num_frames, p.max_sequence_length)


class StepAdapter(PipelineAdapter):
    """A family whose denoise loop the engine drives itself."""

    supports_steps = True
    # True: the family runs both CFG branches in one batched forward (SD3); step caching sees them together.
    cfg_in_batch = False
    # Transformer kwargs that are the same tensor for every row (e.g. FLUX position ids): passed once.
    shared_inputs: frozenset[str] = frozenset()

    def prepare(self, req: DiffusionRequest) -> StepState:
        raise NotImplementedError

    def model_name(self, state: StepState) -> str:
        """Which transformer component runs the state's next step."""
        return "transformer"

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        """Inputs common to both CFG branches at the state's current step (latents, timestep...)."""
        raise NotImplementedError

    def branch_inputs(self, state: StepState) -> list[dict[str, Any]]:
        """[cond] or [cond, uncond] transformer kwargs for the state's current step."""
        common = self.step_inputs(state)
        branches = [{**common, **state.cond}]
        if state.uncond is not None:
            branches.append({**common, **state.uncond})
        return branches

    def collate(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """Many branch inputs → one forward's kwargs: tensors concatenated along rows, lists joined."""
        out = {}
        for key in inputs[0]:
            values = [i[key] for i in inputs]
            if values[0] is None or key in self.shared_inputs:
                out[key] = values[0]
            elif isinstance(values[0], torch.Tensor):
                out[key] = torch.cat(values) if len(values) > 1 else values[0]
            elif isinstance(values[0], list):
                out[key] = [row for v in values for row in v]
            else:
                out[key] = values[0]
        return out

    def guide(self, state: StepState, cond: torch.Tensor, uncond: torch.Tensor | None) -> torch.Tensor:
        if uncond is None:
            return cond
        return uncond + state.extra["guidance"] * (cond - uncond)

    def advance(self, state: StepState, noise_pred: torch.Tensor) -> None:
        t = state.timesteps[state.step_index]
        state.latents = state.scheduler.step(noise_pred, t, state.latents, return_dict=False)[0]
        state.step_index += 1

    def decode(self, state: StepState) -> torch.Tensor:
        raise NotImplementedError

    def private_scheduler(self) -> Any:
        return copy.deepcopy(self.pipe.scheduler)


# ---- Wan
class WanT2VAdapter(StepAdapter):
    """Wan2.1 / Wan2.2 text-to-video (`WanPipeline`), including the two-expert `boundary_ratio` layout.

    Wan2.2 TI2V-5B (`expand_timesteps`: a per-token timestep) is served as whole calls.
    """

    def __init__(self, pipe: Any, limits: dict[str, int] | None = None):
        super().__init__(pipe, limits)
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
        if name == "guidance_scale_2":
            return self.pipe.config.boundary_ratio is not None
        return super()._supports(name)

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
        scheduler = self.private_scheduler()
        scheduler.set_timesteps(p.num_inference_steps, device=self.device)
        latents, extra = self._latents(req)
        scheduler.set_begin_index(0)
        boundary = pipe.config.boundary_ratio
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


# ---- FLUX.1
class FluxAdapter(StepAdapter):
    """FLUX.1 (`FluxPipeline`): guidance-distilled (guidance embedding) plus optional true CFG."""

    shared_inputs = frozenset({"txt_ids", "img_ids"})

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

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
        cfg = pipe.scheduler.config
        mu = calculate_shift(
            latents.shape[1],
            cfg.get("base_image_seq_len", 256),
            cfg.get("max_image_seq_len", 4096),
            cfg.get("base_shift", 0.5),
            cfg.get("max_shift", 1.15),
        )
        scheduler = self.private_scheduler()
        timesteps, _ = retrieve_timesteps(scheduler, n, self.device, sigmas=sigmas, mu=mu)
        guidance = None
        if pipe.transformer.config.guidance_embeds:
            guidance = torch.full([1], p.guidance_scale, device=self.device, dtype=torch.float32).expand(k)
        scheduler.set_begin_index(0)
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


# ---- Stable Diffusion 3
class SD3Adapter(StepAdapter):
    """Stable Diffusion 3 / 3.5 (`StableDiffusion3Pipeline`): classic CFG over CLIP+CLIP+T5 embeddings."""

    cfg_in_batch = True

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor * self.pipe.patch_size

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import (
            calculate_shift,
            retrieve_timesteps,
        )

        pipe, p = self.pipe, req.params
        do_cfg = p.guidance_scale > 1
        embeds, n_embeds, pooled, n_pooled = pipe.encode_prompt(
            prompt=req.prompt,
            prompt_2=None,
            prompt_3=None,
            negative_prompt=req.negative_prompt,
            do_classifier_free_guidance=do_cfg,
            device=self.device,
            clip_skip=None,
            num_images_per_prompt=p.num_outputs,
            max_sequence_length=p.max_sequence_length,
        )
        latents = pipe.prepare_latents(
            p.num_outputs,
            pipe.transformer.config.in_channels,
            p.height,
            p.width,
            embeds.dtype,
            self.device,
            req.generator(),
            None,
        )
        cfg, kwargs = pipe.scheduler.config, {}
        if cfg.get("use_dynamic_shifting", None):
            patch = pipe.transformer.config.patch_size
            seq_len = (latents.shape[2] // patch) * (latents.shape[3] // patch)
            kwargs["mu"] = calculate_shift(
                seq_len,
                cfg.get("base_image_seq_len", 256),
                cfg.get("max_image_seq_len", 4096),
                cfg.get("base_shift", 0.5),
                cfg.get("max_shift", 1.16),
            )
        scheduler = self.private_scheduler()
        timesteps, _ = retrieve_timesteps(
            scheduler, p.num_inference_steps, self.device, sigmas=None, **kwargs
        )
        cond = {"encoder_hidden_states": embeds, "pooled_projections": pooled}
        uncond = {"encoder_hidden_states": n_embeds, "pooled_projections": n_pooled} if do_cfg else None
        return StepState(latents, timesteps, scheduler, cond, uncond, {"guidance": p.guidance_scale})

    def step_inputs(self, state: StepState) -> dict[str, Any]:
        return {
            "hidden_states": state.latents,
            "timestep": state.timesteps[state.step_index].expand(state.rows),
        }

    def decode(self, state: StepState) -> torch.Tensor:
        vae = self.pipe.vae
        latents = (state.latents / vae.config.scaling_factor) + vae.config.shift_factor
        image = vae.decode(latents, return_dict=False)[0]
        return torch.as_tensor(self.pipe.image_processor.postprocess(image, output_type="np"))


# ---- Qwen-Image
class QwenImageAdapter(StepAdapter):
    """Qwen-Image (`QwenImagePipeline`): variable-length text with a mask, true CFG with norm rescaling."""

    @property
    def spatial_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2

    def prepare(self, req: DiffusionRequest) -> StepState:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps

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
        cfg = pipe.scheduler.config
        mu = calculate_shift(
            latents.shape[1],
            cfg.get("base_image_seq_len", 256),
            cfg.get("max_image_seq_len", 4096),
            cfg.get("base_shift", 0.5),
            cfg.get("max_shift", 1.15),
        )
        scheduler = self.private_scheduler()
        timesteps, _ = retrieve_timesteps(scheduler, n, self.device, sigmas=np.linspace(1.0, 1 / n, n), mu=mu)
        guidance = None
        if pipe.transformer.config.guidance_embeds:
            guidance = torch.full([1], p.guidance_scale, device=self.device, dtype=torch.float32).expand(k)
        scheduler.set_begin_index(0)
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


ADAPTERS: dict[str, type[PipelineAdapter]] = {
    "WanPipeline": WanT2VAdapter,
    "WanImageToVideoPipeline": WanI2VAdapter,
    "FluxPipeline": FluxAdapter,
    "StableDiffusion3Pipeline": SD3Adapter,
    "QwenImagePipeline": QwenImageAdapter,
}


def adapter_for(pipe: Any, limits: dict[str, int] | None = None) -> PipelineAdapter:
    """The step adapter of the pipeline's family, or the whole-call adapter for any other pipeline."""
    return ADAPTERS.get(type(pipe).__name__, PipelineAdapter)(pipe, limits)
