"""Memory and kernel options, applied once at load through the libraries that own them (`engine_args`):

  attention_backend: a diffusers attention backend name ("native", "_native_math", "flex", "flash", "sage"...)
      set on every transformer (`ModelMixin.set_attention_backend`).
  quantization: "int8_weight_only" — torchao int8 weight-only quantization of the transformer(s).
  vae_tiling / vae_slicing: true, or a dict of tile sizes for `vae.enable_tiling(...)`.
  offload: "model" (whole components move to the device when used: `enable_model_cpu_offload`),
      "sequential" (`enable_sequential_cpu_offload`), or "group" (diffusers group offloading of transformer
      blocks, `enable_group_offload`, with `offload_group_size` blocks per group).

On a CPU-only machine the weights already live where offloading would put them: the hooks are installed and
run (and the output is unchanged), but they save no memory. They exist for accelerator deployments.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from omnistage.errors import ConfigError

logger = logging.getLogger(__name__)

OFFLOAD_MODES = ("model", "sequential", "group")
QUANTIZATIONS = ("int8_weight_only",)


def transformers_of(pipe: Any) -> list[torch.nn.Module]:
    return [m for n in ("transformer", "transformer_2") if (m := getattr(pipe, n, None)) is not None]


def apply(pipe: Any, engine_args: dict[str, Any]) -> None:
    if engine_args.get("attention_backend"):
        set_attention_backend(pipe, engine_args["attention_backend"])
    if engine_args.get("quantization"):
        quantize(pipe, engine_args["quantization"])
    vae = getattr(pipe, "vae", None)
    tiling = engine_args.get("vae_tiling")
    if tiling and vae is not None:
        try:
            vae.enable_tiling(**(tiling if isinstance(tiling, dict) else {}))
        except TypeError as exc:
            raise ConfigError(
                f"engine_args.vae_tiling: {type(vae).__name__} rejects these tile sizes: {exc}"
            ) from exc
    if engine_args.get("vae_slicing") and vae is not None:
        vae.enable_slicing()
    if engine_args.get("offload"):
        enable_offload(pipe, engine_args["offload"], int(engine_args.get("offload_group_size", 1)))


def set_attention_backend(pipe: Any, name: str) -> None:
    """Pin the backend on this pipeline's attention processors only. (diffusers' `set_attention_backend` also
    switches the process-wide default, which would change every other model in the process; that default is
    restored.)"""
    for module in transformers_of(pipe):
        set_module_attention_backend(module, name)
    logger.info("attention backend %s on %d transformer(s)", name, len(transformers_of(pipe)))


def set_module_attention_backend(module: torch.nn.Module, name: str) -> None:
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    known = [b.value for b in AttentionBackendName]
    if name not in known:
        raise ConfigError(f"engine_args.attention_backend must be one of {', '.join(known)}; got {name!r}")
    default = _AttentionBackendRegistry._active_backend
    try:
        module.set_attention_backend(name)
    finally:
        _AttentionBackendRegistry.set_active_backend(default)


def quantize(pipe: Any, method: str) -> None:
    if method not in QUANTIZATIONS:
        raise ConfigError(
            f"engine_args.quantization must be one of {', '.join(QUANTIZATIONS)}; got {method!r}"
        )
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    for module in transformers_of(pipe):
        quantize_(module, Int8WeightOnlyConfig())
    logger.info("torchao %s applied to the transformer(s)", method)


def enable_offload(pipe: Any, mode: str, group_size: int = 1) -> None:
    if mode not in OFFLOAD_MODES:
        raise ConfigError(f"engine_args.offload must be one of {', '.join(OFFLOAD_MODES)}; got {mode!r}")
    device = pipe._execution_device
    if mode == "model":
        pipe.enable_model_cpu_offload(device=device)
    elif mode == "sequential":
        pipe.enable_sequential_cpu_offload(device=device)
    else:
        for module in transformers_of(pipe):
            module.enable_group_offload(
                onload_device=device,
                offload_device=torch.device("cpu"),
                offload_type="block_level",
                num_blocks_per_group=group_size,
            )
    logger.info("%s offloading enabled (onload device %s)", mode, device)
