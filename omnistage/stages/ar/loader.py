"""Turning a model directory into the three parts the AR engine drives.

The engine never calls a model's own `forward`/`generate`; it needs only the token embedding, the decoder
stack (a transformers base model taking `inputs_embeds` and `position_ids`) and the output head. A plain
LLM is loaded with `AutoModelForCausalLM`; a family whose text stack sits inside a bigger model (an omni
thinker or talker) names its own loader in `engine_args["model_loader"]` ("module:function") with the
signature of `load_causal_lm` and returns a `LoadedModel` (or any object with the same attributes).

A loader must load the decoder with `attn_implementation=ATTENTION_NAME` (for composite configs, on the
text sub-config only), so that its attention layers call the engine's paged attention.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import torch

from omnistage.errors import ConfigError
from omnistage.stages.ar.attention import ATTENTION_NAME

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class LoadedModel:
    """embed: ids [T] → [T, H]; decoder: forward(inputs_embeds=[1, T, H], position_ids=..., **kw) with
    `.last_hidden_state`; head: [N, H] → [N, V]; config: the decoder's text config."""

    embed: torch.nn.Module
    decoder: torch.nn.Module
    head: torch.nn.Module
    config: Any
    tokenizer: Any | None = None
    eos_token_ids: list[int] = dataclasses.field(default_factory=list)
    root: torch.nn.Module | None = None  # owns every weight (moved on sleep); defaults to the decoder
    # Encoder-decoder models: encoder output [S, H] → each layer's cross-attention K/V (cross_attention.py).
    cross_kv: Any | None = None
    encoder_hidden_size: int | None = None  # the encoder output's width, where it is not the decoder's
    # `fn(output_token_ids, logits[V]) -> logits` run for every request before its own (e.g. a recogniser's
    # suppressed tokens, which its `generate` applies to every step).
    logits_processors: list[Any] = dataclasses.field(default_factory=list)
    # Modules a post-sample hook runs every step (a code predictor): the engine packs their linears as it
    # packs the decoder's and the head's.
    step_modules: list[torch.nn.Module] = dataclasses.field(default_factory=list)
    # Other output heads, by name, that a request picks instead of `head` (`ARInputs.head`): a model that
    # answers in text or writes image tokens from one decoder (Janus). Their logits are padded with -inf to
    # the widest head's, so rows of both share one sampler.
    heads: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict)


def load_causal_lm(model_dir: str, dtype: torch.dtype, device: str) -> LoadedModel:
    """Default loader: any `...ForCausalLM` checkpoint directory with an optional tokenizer beside it."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=ATTENTION_NAME)
    model.to(device).eval()
    return LoadedModel(
        embed=model.get_input_embeddings(),
        decoder=model.get_decoder(),
        head=model.get_output_embeddings(),
        config=model.config,
        tokenizer=load_tokenizer(model_dir),
        eos_token_ids=eos_token_ids(model_dir, model.config),
        root=model,
    )


def load_tokenizer(model_dir: str) -> Any | None:
    """The directory's tokenizer, or None when it has none (token-id-only stages such as a talker)."""
    path = Path(model_dir)
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def eos_token_ids(model_dir: str, config: Any) -> list[int]:
    """EOS ids the way `generate` sees them: generation_config.json first, then the model config."""
    value = None
    gen = Path(model_dir) / "generation_config.json"
    if gen.exists():
        value = json.loads(gen.read_text()).get("eos_token_id")
    if value is None:
        value = getattr(config, "eos_token_id", None)
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def check_loaded(loaded: Any, loader_name: str) -> LoadedModel:
    """Accept any object with the LoadedModel attributes and fail with the loader's name if it lacks one."""
    for attr in ("embed", "decoder", "head", "config"):
        if getattr(loaded, attr, None) is None:
            raise ConfigError(f"model_loader {loader_name} returned an object without {attr!r}")
    impl = getattr(loaded.config, "_attn_implementation", None)
    if impl != ATTENTION_NAME:
        raise ConfigError(
            f"model_loader {loader_name}: the decoder uses attention {impl!r}; load it with "
            f"attn_implementation={ATTENTION_NAME!r}"
        )
    layer_types = getattr(loaded.config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise ConfigError(
            f"model_loader {loader_name}: layer types {sorted(set(layer_types))}; the AR engine's paged "
            "attention covers full attention only (no sliding-window or linear-attention layers yet)"
        )
    if not isinstance(loaded, LoadedModel):
        loaded = LoadedModel(
            embed=loaded.embed,
            decoder=loaded.decoder,
            head=loaded.head,
            config=loaded.config,
            tokenizer=getattr(loaded, "tokenizer", None),
            eos_token_ids=list(getattr(loaded, "eos_token_ids", None) or []),
            root=getattr(loaded, "root", None),
            cross_kv=getattr(loaded, "cross_kv", None),
            encoder_hidden_size=getattr(loaded, "encoder_hidden_size", None),
            logits_processors=list(getattr(loaded, "logits_processors", None) or []),
            heads=dict(getattr(loaded, "heads", None) or {}),
        )
    if loaded.root is None:
        loaded.root = loaded.decoder
    return loaded


def resolve_dtype(requested: str, model_dir: str | None, device: str) -> torch.dtype:
    """The compute dtype. "auto" takes the checkpoint's dtype, except on a CPU: there fp16 runs in bf16
    (as vLLM's CPU backend does: oneDNN's fp16 without AMX-FP16 is no faster than fp32, while bf16 on AMX is
    ~3x faster; a tiny speech encoder, one thread: fp32 0.33 s, fp16 0.35 s, bf16 0.11 s), and
    bf16 on a CPU without native support for it (no AVX512-BF16/AMX: oneDNN emulates it, several times
    slower than fp32) runs in float32. A quantized checkpoint (a GGUF's blocks beside it) runs in bf16 where
    the CPU computes bf16 natively: its weights hold 4-8 bits, and there bf16 is the fastest form that stays
    as close to the float model as llama.cpp does (benchmarks/RESULTS.md, issue 63). An explicit dtype is
    always honoured."""
    if requested != "auto":
        return getattr(torch, requested)
    name = None
    if model_dir and (Path(model_dir) / "config.json").exists():
        config = json.loads((Path(model_dir) / "config.json").read_text())
        name = config.get("dtype") or config.get("torch_dtype")
        name = name or (config.get("text_config") or {}).get("dtype")
    dtype = getattr(torch, name) if isinstance(name, str) and hasattr(torch, name) else torch.float32
    if torch.device(device).type != "cpu":
        return dtype
    if dtype is torch.float16 or (quantized_checkpoint(model_dir) and cpu_has_native(torch.bfloat16)):
        dtype = torch.bfloat16
    if dtype is torch.bfloat16 and not cpu_has_native(dtype):
        logger.info("checkpoint dtype %s has no native support on this CPU; computing in float32", dtype)
        return torch.float32
    return dtype


def quantized_checkpoint(model_dir: str | None) -> bool:
    """Whether `model_dir` holds quantized blocks beside its weights (a GGUF's, written at conversion)."""
    from omnistage.stages.ar.cpu.quantized_linear import BLOCKS_FILE

    return bool(model_dir) and (Path(model_dir) / BLOCKS_FILE).is_file()


def cpu_has_native(dtype: torch.dtype) -> bool:
    """Whether oneDNN computes bf16 / fp16 natively on this CPU (else it emulates them, slowly)."""
    try:
        if dtype is torch.bfloat16:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    except (AttributeError, RuntimeError):
        return False
