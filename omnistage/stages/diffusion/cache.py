"""Step caching: reuse transformer work between denoise steps, per request.

Two backends behind one interface (`StepCache`):
  - cache-dit (`cache_dit.enable_cache` on each transformer, transformer-only mode): DBCache — always compute
    the first `Fn` / last `Bn` blocks, reuse the cached residual of the middle blocks while the first blocks'
    residual changes less than `residual_diff_threshold` — optionally with TaylorSeer forecasting, or a fixed
    schedule (`steps_computation_mask` + `steps_computation_policy="static"`).
  - TeaCache (implemented here on diffusers' hook registry: no library ships it): skip every block while the
    accumulated, polynomially rescaled relative L1 change of the first block's timestep-modulated input stays
    below `rel_l1_thresh`, adding the residual cached at the last computed step (the polynomial and the
    modulation of each transformer class: what its family registered in teacache_rules.py).

cache-dit keeps one context per block list; the engine gives every request (or request-mode wave) its own
context object and installs it around that request's forwards, so requests at different steps never share
cache buffers. Requests without caching bypass the hooks entirely, so their output is bit-identical to the
uncached model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from diffusers.hooks import HookRegistry
from diffusers.hooks._helpers import TransformerBlockRegistry
from diffusers.hooks.hooks import ModelHook

from omnistage.errors import InvalidRequestError
from omnistage.stages.diffusion.teacache_rules import ModulatedInput, teacache_rule

os.environ.setdefault("CACHE_DIT_LOG_LEVEL", "warning")  # cache-dit logs every context at INFO
logger = logging.getLogger(__name__)

# Defaults follow vLLM-Omni's cache-dit settings: F1B0, warm up 4 steps, at most 3 cached steps in a row.
CACHE_DIT_DEFAULTS = {
    "Fn_compute_blocks": 1,
    "Bn_compute_blocks": 0,
    "residual_diff_threshold": 0.24,
    "max_warmup_steps": 4,
    "warmup_interval": 1,
    "max_cached_steps": -1,
    "max_continuous_cached_steps": 3,
    "steps_computation_mask": None,  # per step 1 (compute) / 0 (cache), or slow | medium | fast | ultra
    "steps_computation_policy": "dynamic",  # "static": follow the mask exactly (a fixed caching schedule)
    "enable_taylorseer": False,
    "taylorseer_order": 1,
}
TEACACHE_DEFAULTS = {"rel_l1_thresh": 0.2, "coefficients": None}
BLOCK_LISTS = ("blocks", "transformer_blocks", "single_transformer_blocks")


def _options(backend: str, options: dict[str, Any]) -> dict[str, Any]:
    defaults = CACHE_DIT_DEFAULTS if backend == "cache_dit" else TEACACHE_DEFAULTS
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise InvalidRequestError(
            f"cache_options: unknown {backend} option {unknown[0]!r}; known: {', '.join(sorted(defaults))}",
            param="cache_options",
        )
    return {**defaults, **options}


def validate(backend: str | None, options: dict[str, Any], num_steps: int) -> None:
    """Raise InvalidRequestError naming `cache_options` when the options break a rule."""
    if backend is None:
        return
    opts = _options(backend, options)
    if backend == "teacache":
        if not float(opts["rel_l1_thresh"]) > 0:
            raise InvalidRequestError("cache_options.rel_l1_thresh must be > 0", param="cache_options")
        coefficients = opts["coefficients"]
        if coefficients is not None and (not isinstance(coefficients, list) or len(coefficients) != 5):
            raise InvalidRequestError(
                "cache_options.coefficients must be a list of 5 numbers", param="cache_options"
            )
        return
    mask = opts["steps_computation_mask"]
    if isinstance(mask, str) and mask not in ("slow", "medium", "fast", "ultra"):
        raise InvalidRequestError(
            "cache_options.steps_computation_mask must be a 0/1 list or slow|medium|fast|ultra",
            param="cache_options",
        )
    if isinstance(mask, list) and (len(mask) != num_steps or set(mask) - {0, 1}):
        raise InvalidRequestError(
            f"cache_options.steps_computation_mask must be {num_steps} values of 0/1 (one per step)",
            param="cache_options",
        )
    if opts["steps_computation_policy"] not in ("dynamic", "static"):
        raise InvalidRequestError(
            "cache_options.steps_computation_policy must be dynamic or static", param="cache_options"
        )


# ---- per-request state
@dataclasses.dataclass
class TeaBranch:
    """TeaCache state of one CFG branch of one request."""

    accumulated: float = 0.0
    previous_modulated: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    residual_encoder: torch.Tensor | None = None
    forwards: int = 0
    cached: int = 0
    # Per-forward scratch: the head block's inputs while computing, or whether this forward reuses the cache.
    head_hidden: torch.Tensor | None = None
    head_encoder: torch.Tensor | None = None
    reuse: bool = False


@dataclasses.dataclass
class RequestCache:
    """One request's (or one request-mode wave's) cache: a cache-dit context per block list, or TeaCache
    branches. `branches` is how many transformer forwards one denoise step makes (2 with separate CFG)."""

    backend: str
    options: dict[str, Any]
    num_steps: int
    branches: int
    contexts: dict[tuple[int, str], Any] = dataclasses.field(default_factory=dict)
    tea: list[TeaBranch] = dataclasses.field(default_factory=list)
    forward_count: int = 0

    def metrics(self) -> dict[str, Any]:
        if self.backend == "teacache":
            cached = self.tea[0].cached if self.tea else 0
            out = {"cache": "teacache", "cached_steps": cached, "computed_steps": self.num_steps - cached}
            if len(self.tea) > 1:
                out["cfg_cached_steps"] = self.tea[1].cached
            return out
        cached = sorted({s for ctx in self.contexts.values() for s in ctx.get_cached_steps()})
        cfg_cached = sorted({s for ctx in self.contexts.values() for s in ctx.get_cfg_cached_steps()})
        out = {
            "cache": "cache_dit",
            "cached_steps": len(cached),
            "computed_steps": self.num_steps - len(cached),
        }
        if self.branches > 1:
            out["cfg_cached_steps"] = len(cfg_cached)
        return out


# ---- TeaCache hooks
def _modulated_input(
    modulate: ModulatedInput | None, block: torch.nn.Module, hidden: torch.Tensor, temb: torch.Tensor | None
) -> torch.Tensor:
    """The first block's timestep-modulated input: TeaCache's proxy for how much this step's output moves.
    `modulate`: the transformer's own rule (teacache_rules.py), if its family registered one."""
    if temb is None:
        return hidden
    if modulate is not None:
        return modulate(block, hidden, temb)
    norm = getattr(block, "norm1", None)
    if norm is not None and "emb" in norm.forward.__code__.co_varnames:  # AdaLayerNormZero
        return norm(hidden, emb=temb)[0]
    return hidden


class TeaCacheController:
    """Owns the hooks on one transformer; `active` is the branch state of the forward in progress (None: the
    hooks pass straight through)."""

    def __init__(self, transformer: torch.nn.Module):
        self.active: TeaBranch | None = None
        self.request: RequestCache | None = None
        rule = teacache_rule(type(transformer).__name__)
        self.coefficients, self.modulate = rule.coefficients, rule.modulated_input
        blocks = [b for name in BLOCK_LISTS for b in getattr(transformer, name, None) or []]
        if not blocks:
            raise ValueError(f"TeaCache: {type(transformer).__name__} has no transformer block list")
        for i, block in enumerate(blocks):
            hook = _TeaBlockHook(self, head=i == 0, tail=i == len(blocks) - 1)
            HookRegistry.check_if_exists_or_initialize(block).register_hook(hook, "omnistage_teacache")

    def begin_forward(self) -> None:
        rc = self.request
        self.active = rc.tea[rc.forward_count % rc.branches] if rc is not None else None
        if rc is not None:
            rc.forward_count += 1

    def decide(self, branch: TeaBranch, modulated: torch.Tensor) -> bool:
        """True: reuse the cached residual for this forward."""
        rc = self.request
        step = branch.forwards
        previous, branch.previous_modulated = branch.previous_modulated, modulated.detach()
        branch.forwards += 1
        if previous is None or branch.residual is None or step >= rc.num_steps - 1:
            branch.accumulated = 0.0
            return False
        change = ((modulated - previous).abs().mean() / (previous.abs().mean() + 1e-8)).item()
        coefficients = rc.options["coefficients"] or self.coefficients
        branch.accumulated += abs(float(np.poly1d(coefficients)(change))) if coefficients else change
        if branch.accumulated < float(rc.options["rel_l1_thresh"]):
            branch.cached += 1
            return True
        branch.accumulated = 0.0
        return False


class _TeaBlockHook(ModelHook):
    """Hook on every block: the head decides and, when reusing, returns input + cached residual; the others
    pass their input through; the tail records the residual after a computed forward."""

    def __init__(self, controller: TeaCacheController, head: bool, tail: bool):
        super().__init__()
        self.controller, self.head, self.tail = controller, head, tail
        self.meta = None

    def initialize_hook(self, module):
        self.meta = TransformerBlockRegistry.get(type(module))
        return module

    def _arg(self, name: str, args, kwargs):
        try:
            return self.meta._get_parameter_from_args_kwargs(name, args, kwargs)
        except (ValueError, IndexError):
            return None

    def _pack(self, like: Any, hidden: torch.Tensor, encoder: torch.Tensor | None) -> Any:
        if not isinstance(like, tuple):
            return hidden
        out = list(like)
        out[self.meta.return_hidden_states_index] = hidden
        if self.meta.return_encoder_hidden_states_index is not None:
            out[self.meta.return_encoder_hidden_states_index] = encoder
        return tuple(out)

    def new_forward(self, module, *args, **kwargs):
        ctl = self.controller
        if self.head:
            ctl.begin_forward()
        branch = ctl.active
        if branch is None:
            return self.fn_ref.original_forward(*args, **kwargs)
        hidden = self._arg("hidden_states", args, kwargs)
        encoder = self._arg("encoder_hidden_states", args, kwargs)
        if self.head:
            modulated = _modulated_input(ctl.modulate, module, hidden, self._arg("temb", args, kwargs))
            branch.reuse = ctl.decide(branch, modulated)
            branch.head_hidden, branch.head_encoder = hidden, encoder
        if branch.reuse:
            if self.head:
                hidden = hidden + branch.residual
                if encoder is not None and branch.residual_encoder is not None:
                    encoder = encoder + branch.residual_encoder
            like = (None, None) if self.meta.return_encoder_hidden_states_index is not None else hidden
            return self._pack(like, hidden, encoder)
        output = self.fn_ref.original_forward(*args, **kwargs)
        if self.tail:
            out_hidden = output[self.meta.return_hidden_states_index] if isinstance(output, tuple) else output
            branch.residual = (out_hidden - branch.head_hidden).detach()
            enc_index = self.meta.return_encoder_hidden_states_index
            out_encoder = output[enc_index] if isinstance(output, tuple) and enc_index is not None else None
            if out_encoder is not None and branch.head_encoder is not None:
                branch.residual_encoder = (out_encoder - branch.head_encoder).detach()
        return output


# ---- the manager the runner talks to
class StepCache:
    """Installs cache hooks on the pipeline's transformers on first use and switches per-request state."""

    def __init__(self, pipe: Any, stage_policy: dict[str, Any] | None = None):
        self.pipe = pipe
        self.stage_policy = dict(stage_policy or {})
        self._cache_dit_installed: set[int] = set()
        self._tea: dict[int, TeaCacheController] = {}
        if self.stage_policy:
            backend = self.stage_policy.pop("backend", None)
            validate(
                backend,
                self.stage_policy,
                num_steps=0
                if "steps_computation_mask" not in self.stage_policy
                else len(self.stage_policy["steps_computation_mask"]),
            )
            self.stage_policy = {"backend": backend, **self.stage_policy}

    def policy(self, params) -> tuple[str, dict[str, Any]] | None:
        """(backend, options) a request runs with: its own, else the stage's, else None."""
        if params.cache is not None:
            return params.cache, dict(params.cache_options)
        if self.stage_policy.get("backend"):
            opts = {k: v for k, v in self.stage_policy.items() if k != "backend"}
            return self.stage_policy["backend"], opts
        return None

    def transformers(self) -> list[tuple[str, torch.nn.Module]]:
        return [
            (n, getattr(self.pipe, n))
            for n in ("transformer", "transformer_2")
            if getattr(self.pipe, n, None)
        ]

    def new_request(
        self, params, num_steps: int, branches: int, steps_per_model: dict[str, int] | None = None
    ) -> RequestCache | None:
        policy = self.policy(params)
        if policy is None:
            return None
        backend, options = policy
        opts = _options(backend, options)
        rc = RequestCache(backend, opts, num_steps, branches)
        if backend == "teacache":
            for _, module in self.transformers():
                self._teacache(module)
            rc.tea = [TeaBranch() for _ in range(branches)]
            return rc
        for name, module in self.transformers():
            self._install_cache_dit(module)
            steps = (steps_per_model or {}).get(name, num_steps)
            for context_name in module._context_names:
                rc.contexts[(id(module), context_name)] = self._context(context_name, opts, steps, branches)
        return rc

    @contextlib.contextmanager
    def activate(self, rc: RequestCache | None, module: torch.nn.Module) -> Iterator[None]:
        """Run `module`'s forwards in the block under `rc` (None: no caching). Hooks of the other backend
        stay out of the way: cache-dit's forward is bypassed, TeaCache's hooks pass through."""
        if rc is None or rc.backend == "teacache":
            with self._bypass(module), self._teacache_request(rc, module):
                yield
            return
        manager = module._context_manager
        saved = dict(manager._cached_context_manager)
        for context_name in module._context_names:
            manager._cached_context_manager[context_name] = rc.contexts[(id(module), context_name)]
        try:
            yield
        finally:
            manager._cached_context_manager.clear()
            manager._cached_context_manager.update(saved)

    @contextlib.contextmanager
    def _teacache_request(self, rc: RequestCache | None, module: torch.nn.Module) -> Iterator[None]:
        controller = self._tea.get(id(module))
        if rc is None or controller is None:
            yield
            return
        controller.request = rc
        try:
            yield
        finally:
            controller.request, controller.active = None, None

    @contextlib.contextmanager
    def _bypass(self, module: torch.nn.Module) -> Iterator[None]:
        original = (
            getattr(module, "_original_forward", None) if id(module) in self._cache_dit_installed else None
        )
        if original is None:
            yield
            return
        patched = module.forward
        module.forward = original
        try:
            yield
        finally:
            module.forward = patched

    def _teacache(self, module: torch.nn.Module) -> TeaCacheController:
        if id(module) not in self._tea:
            self._tea[id(module)] = TeaCacheController(module)
        return self._tea[id(module)]

    def _install_cache_dit(self, module: torch.nn.Module) -> None:
        if id(module) in self._cache_dit_installed:
            return
        import cache_dit

        for name in list(logging.root.manager.loggerDict):
            if name.startswith("cache_dit"):
                logging.getLogger(name).setLevel(logging.WARNING)
        config = cache_dit.DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=0)
        cache_dit.enable_cache(module, cache_config=config)
        self._cache_dit_installed.add(id(module))
        logger.info("cache-dit hooks installed on %s", type(module).__name__)

    @staticmethod
    def _context(name: str, opts: dict[str, Any], num_steps: int, branches: int) -> Any:
        import cache_dit
        from cache_dit.caching.cache_contexts.cache_context import CachedContext

        mask = opts["steps_computation_mask"]
        if isinstance(mask, str):
            mask = cache_dit.steps_mask(total_steps=num_steps, mask_policy=mask)
        config = cache_dit.DBCacheConfig(
            Fn_compute_blocks=opts["Fn_compute_blocks"],
            Bn_compute_blocks=opts["Bn_compute_blocks"],
            residual_diff_threshold=opts["residual_diff_threshold"],
            max_warmup_steps=opts["max_warmup_steps"],
            warmup_interval=opts["warmup_interval"],
            max_cached_steps=opts["max_cached_steps"],
            max_continuous_cached_steps=opts["max_continuous_cached_steps"],
            enable_separate_cfg=branches > 1,
            num_inference_steps=num_steps or None,
            steps_computation_mask=mask,
            steps_computation_policy=opts["steps_computation_policy"],
        )
        calibrator = None
        if opts["enable_taylorseer"]:
            calibrator = cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=int(opts["taylorseer_order"]))
        return CachedContext(name=name, cache_config=config, calibrator_config=calibrator)
