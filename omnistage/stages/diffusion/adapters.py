"""Pipeline adapters: what the engine needs to know about one diffusers pipeline class.

`PipelineAdapter` serves any pipeline as whole calls (request mode): it resolves defaults from the
pipeline's own `__call__` signature, validates a request against the model's rules, and maps a batch of
compatible requests onto one call with one generator per request.

`StepAdapter` subclasses split a family's `__call__` at its step boundaries, reusing the pipeline's own
helpers (`encode_prompt`, `prepare_latents`, its VAE and post-processor): `prepare` (encode, latents,
a private scheduler), `branch_inputs` (the transformer inputs of one denoise step), `guide` (CFG combine)
and `decode`. The runner concatenates branch inputs of many requests into one transformer forward, so
requests at different steps share it; each family's `prepare`/`guide`/`decode` follow its diffusers
`__call__` line by line, so a request's result equals a plain pipeline call for the same seed.

Step adapters live in their families' packages (omnistage/families/<family>/adapter.py); each family's
`register()` names the pipeline classes its adapters serve (`register_step_adapter`), so the engine never
knows a family by name.
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
    # What the pipeline produces ("image", "video" or "audio"), where the adapter knows its pipeline (a
    # family's step adapter); None: what its caller says (the stage's output modality), else "image".
    modality: str | None = None
    # Spatial multiple for height/width; None: read the pipeline's VAE scale factor.
    size_multiple: int | None = None

    def __init__(self, pipe: Any, limits: dict[str, int] | None = None, modality: str | None = None):
        self.pipe = pipe
        self.class_name = type(pipe).__name__
        self.modality = type(self).modality or modality or "image"
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
        for name in ("true_cfg_scale", "guidance_scale_2", "boundary_ratio", "flow_shift"):
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
    # True: the family runs both CFG branches in one batched forward; step caching sees them together.
    cfg_in_batch = False
    # Transformer kwargs that are the same tensor for every row (e.g. position ids): passed once.
    shared_inputs: frozenset[str] = frozenset()
    # The forward kwarg that holds the latents: its rows are the batch the engine splits outputs by.
    latent_input = "hidden_states"
    # Why the family's branches cannot be split across CFG-parallel / Ulysses ranks (None: they can).
    parallel_refused: str | None = None

    def prepare(self, req: DiffusionRequest) -> StepState:
        raise NotImplementedError

    def model_name(self, state: StepState) -> str:
        """Which transformer component runs the state's next step."""
        return "transformer"

    def steps_per_model(self, state: StepState) -> dict[str, int] | None:
        """How many of the state's steps each transformer component runs, where the pipeline has several
        (step caching counts steps per transformer); None: "transformer" runs them all."""
        return None

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

    def forward_groups(self, inputs: list[dict[str, Any]]) -> list[list[int]]:
        """Which branch inputs share a forward (indices into `inputs`): all of them, unless the family's
        transformer cannot pad what differs between them (e.g. text lengths) without changing results."""
        return [list(range(len(inputs)))]

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

    def run_model(self, module: torch.nn.Module, kwargs: dict[str, Any]) -> torch.Tensor:
        """One forward over collated inputs → its output rows as one tensor. A family whose transformer takes
        and returns per-row lists converts here (its CFG-parallel ranks are refused: `parallel_refused`)."""
        return module(**kwargs, return_dict=False)[0]

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


_STEP_ADAPTERS: dict[str, type[StepAdapter]] = {}


def register_step_adapter(pipeline_class_name: str, adapter: type[StepAdapter]) -> None:
    """Serve the diffusers pipeline class called `pipeline_class_name` step by step with `adapter` (a family's
    `register()` calls this; the last registration of a class wins)."""
    _STEP_ADAPTERS[pipeline_class_name] = adapter


def adapter_for(
    pipe: Any, limits: dict[str, int] | None = None, modality: str | None = None
) -> PipelineAdapter:
    """The step adapter registered for the pipeline's class, or the whole-call adapter for any other pipeline.
    `modality` is what the caller serves (the stage's output modality), for an adapter that cannot tell."""
    return _STEP_ADAPTERS.get(type(pipe).__name__, PipelineAdapter)(pipe, limits, modality)
