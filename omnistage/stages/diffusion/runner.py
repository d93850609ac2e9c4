"""Executes what the scheduler decided: whole pipeline calls (request mode) or encode / one denoise step /
decode for a group of requests (step mode). Owns the loaded pipeline, its family adapter, the step cache and
the executor that runs transformer forwards (in this process, or across processes for CFG / Ulysses)."""

from __future__ import annotations

import contextlib
import itertools
import logging
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.stages.diffusion import offload, text_padding
from omnistage.stages.diffusion.adapters import PipelineAdapter, StepAdapter, adapter_for
from omnistage.stages.diffusion.cache import StepCache, validate
from omnistage.stages.diffusion.lora import DEFAULT_MAX_LORAS, LoraCache
from omnistage.stages.diffusion.parallel import LocalExecutor, make_executor
from omnistage.stages.diffusion.request import DiffusionRequest

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def load_pipeline(
    model_dir: str, dtype: str = "auto", device: str = "cpu", skip: tuple[str, ...] = ()
) -> Any:
    """A diffusers pipeline from a local directory (`model_index.json`); never downloads. Components in `skip`
    are not loaded (None). The cross-attentions whose processor a family registered a padding-collapsing one
    for run on collapsed prompt padding (`text_padding`)."""
    from diffusers import DiffusionPipeline

    torch_dtype = DTYPES.get(dtype, torch.float32 if device == "cpu" else torch.bfloat16)
    absent = dict.fromkeys(skip)
    pipe = DiffusionPipeline.from_pretrained(model_dir, dtype=torch_dtype, local_files_only=True, **absent)
    pipe.set_progress_bar_config(disable=True)
    for module in offload.transformers_of(pipe):
        text_padding.install(module)
    return pipe.to(device)


class DiffusionRunner:
    def __init__(
        self,
        model_dir: str,
        dtype: str,
        device: str,
        engine_args: dict[str, Any],
        modality: str | None = None,
    ):
        self.model_dir = model_dir
        self.pipe = load_pipeline(model_dir, dtype, device, tuple(engine_args.get("skip_components") or ()))
        offload.apply(self.pipe, engine_args)
        self.adapter: PipelineAdapter = adapter_for(self.pipe, engine_args.get("limits"), modality)
        self.cache = StepCache(self.pipe, engine_args.get("cache"))
        max_loras = int(engine_args.get("max_loras", DEFAULT_MAX_LORAS))
        self.loras = LoraCache(self.pipe, max_loras, engine_args.get("offload"))
        self.dtype = dtype
        self.executor = LocalExecutor(self.pipe)

    def start_executor(self, engine_args: dict[str, Any]) -> None:
        """Spawn the parallel ranks, if the stage asks for CFG-parallel or Ulysses (after config checks)."""
        self.executor = make_executor(self.pipe, self.model_dir, self.dtype, engine_args)

    @property
    def supports_steps(self) -> bool:
        return isinstance(self.adapter, StepAdapter) and self.adapter.supports_steps

    def resolve(self, params, images):
        if params.lora is not None and self.executor.world_size > 1:
            raise InvalidRequestError(
                "lora: not available on a CFG-parallel / Ulysses stage (its ranks hold the base weights)",
                param="lora",
            )
        params = self.adapter.resolve(params, images)
        policy = self.cache.policy(params)
        if policy is not None:
            if self.executor.world_size > 1:
                raise InvalidRequestError(
                    "cache is not available on a CFG-parallel / Ulysses stage (caching decides per request; "
                    "parallel ranks run shared batches)",
                    param="cache",
                )
            validate(policy[0], policy[1], int(params.num_inference_steps or 0))
        return params

    # ---- request mode
    @torch.no_grad()
    def run_wave(self, reqs: list[DiffusionRequest]) -> list[torch.Tensor]:
        """One pipeline call for compatible requests; float outputs per request. Caching (if any) is shared
        by the wave: one context, one set of decisions."""
        rc = self._wave_cache(reqs[0])
        self.loras.apply(reqs[0].params.lora)  # one adapter a wave (the batch key)
        with contextlib.ExitStack() as stack:
            for _, module in self.cache.transformers():
                stack.enter_context(self.cache.activate(rc, module))
            result = self.pipe(**self.adapter.call_kwargs(reqs))
        if rc is not None:
            for req in reqs:
                req.timings["cache"] = rc.metrics()
        return self.adapter.split_output(result, reqs)

    def _wave_cache(self, req: DiffusionRequest):
        p = req.params
        cfg = (p.guidance_scale or 0) > 1 or ((p.true_cfg_scale or 0) > 1 and p.negative_prompt is not None)
        separate = cfg and not getattr(self.adapter, "cfg_in_batch", False)
        return self.cache.new_request(p, req.num_steps, 2 if separate else 1)

    # ---- step mode
    @torch.no_grad()
    def prepare(self, req: DiffusionRequest) -> None:
        """Encode the prompt, draw the latents, copy the scheduler: the request can now take steps."""
        adapter: StepAdapter = self.adapter
        self.loras.apply(req.params.lora)  # an adapter may reach the text encoders too
        state = adapter.prepare(req)
        branches = 1 if state.uncond is None or adapter.cfg_in_batch else 2
        steps = adapter.steps_per_model(state)  # cache-dit counts steps per transformer
        state.cache = self.cache.new_request(req.params, state.total_steps, branches, steps)
        req.state = state

    @torch.no_grad()
    def denoise(self, reqs: list[DiffusionRequest]) -> None:
        """Advance every request by one step: uncached requests share forwards, cached ones run alone under
        their own cache state (cache decisions are per request)."""
        adapter: StepAdapter = self.adapter
        plain = [r for r in reqs if r.state.cache is None]
        for model_name, group in itertools.groupby(
            sorted(plain, key=lambda r: adapter.model_name(r.state)),
            key=lambda r: adapter.model_name(r.state),
        ):
            self._shared_step(model_name, list(group))
        for req in reqs:
            if req.state.cache is not None:
                self._cached_step(req)

    def _shared_step(self, model_name: str, group: list[DiffusionRequest]) -> None:
        adapter: StepAdapter = self.adapter
        conds, unconds, guided = [], [], []
        for req in group:
            branches = adapter.branch_inputs(req.state)
            conds.append(branches[0])
            unconds.extend(branches[1:])
            guided.append(len(branches) > 1)  # (a family may skip guidance at some steps)
        module = getattr(self.pipe, model_name)
        self.loras.apply(group[0].params.lora)  # one adapter a group (the batch key)
        with self.cache.activate(None, module):
            cond_out, uncond_out = self.executor.forward(model_name, conds, unconds, adapter)
        uncond_iter = iter(uncond_out)
        for req, cond, has_uncond in zip(group, cond_out, guided, strict=True):
            uncond = next(uncond_iter) if has_uncond else None
            adapter.advance(req.state, adapter.guide(req.state, cond, uncond))

    def _cached_step(self, req: DiffusionRequest) -> None:
        adapter: StepAdapter = self.adapter
        state = req.state
        model_name = adapter.model_name(state)
        module = getattr(self.pipe, model_name)
        branches = adapter.branch_inputs(state)
        self.loras.apply(req.params.lora)
        with self.cache.activate(state.cache, module):
            if adapter.cfg_in_batch and len(branches) == 2:
                uncond, cond = self.executor.forward_local(model_name, [branches[1], branches[0]], adapter)
                outs = [cond, uncond]
            else:
                outs = [self.executor.forward_local(model_name, [b], adapter)[0] for b in branches]
        adapter.advance(state, adapter.guide(state, outs[0], outs[1] if len(outs) > 1 else None))

    @torch.no_grad()
    def decode(self, req: DiffusionRequest) -> torch.Tensor:
        self.loras.apply(req.params.lora)
        return self.adapter.decode(req.state)

    def shutdown(self) -> None:
        self.executor.shutdown()
