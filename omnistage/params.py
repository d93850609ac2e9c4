"""Per-stage request parameters.

They are msgspec Structs so they cross process boundaries without pickling; construction validates,
so a bad value fails where the user wrote it, with the field's name.
"""

from __future__ import annotations

import functools
import json as _json
from collections.abc import Mapping
from typing import Any

import msgspec

from omnistage.errors import InvalidRequestError


def _check(ok: bool, field: str, rule: str) -> None:
    if not ok:
        raise InvalidRequestError(f"{field} {rule}", param=field)


class StructuredOutputs(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Hold the output to one constraint (vLLM's `structured_outputs`): a JSON schema (`json`, an object or
    its text), any JSON object, a regex, one of `choice`, or an EBNF `grammar`. `source` is the request
    field it came from, which a constraint that cannot be compiled is refused naming."""

    json: Any = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    source: str = "structured_outputs"

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        _check(
            len(given) == 1,
            self.source,
            f"must set exactly one of json, json_object, regex, choice, grammar (got {given or 'none'})",
        )
        _check(
            self.choice is None
            or (len(self.choice) > 0 and all(isinstance(c, str) and c for c in self.choice)),
            self.source,
            "choice must be non-empty strings",
        )
        _check(
            self.json is None or isinstance(self.json, dict | str),
            self.source,
            "json must be a JSON schema (an object, or its text)",
        )

    def kind(self) -> tuple[str, str]:
        """(kind, its value as text): what the compiled-grammar cache keys on."""
        if self.json is not None:
            # not sorted: the properties come out in the order the schema gives them
            value = self.json if isinstance(self.json, str) else _json.dumps(self.json)
            return "json", value
        if self.json_object:
            return "json_object", ""
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", _json.dumps(self.choice)
        return "grammar", str(self.grammar)


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True, tag=True):
    """Sampling for autoregressive stages (LLM, thinker, talker)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    allowed_token_ids: list[int] | None = None
    # Dotted paths "module:function" (callables are accepted in-process and converted by the stage).
    logits_processors: list[Any] = msgspec.field(default_factory=list)
    return_hidden_states: bool = False  # the last layer's, i.e. hidden_state_layers [-1]
    # transformers' `hidden_states` indices (0 = the embeddings, -1 = the last layer), out by layer
    hidden_state_layers: list[int] = msgspec.field(default_factory=list)
    structured_outputs: StructuredOutputs | None = None  # structured.py: a grammar the output keeps to
    extra: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(self.n >= 1, "n", "must be >= 1")
        _check(self.temperature >= 0.0, "temperature", "must be >= 0")
        _check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        _check(self.top_k >= -1, "top_k", "must be -1, 0 (disabled) or a positive integer")
        _check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]")
        _check(self.repetition_penalty > 0.0, "repetition_penalty", "must be > 0")
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]")
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]")
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1")
        _check(self.min_tokens >= 0, "min_tokens", "must be >= 0")
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            "must be <= max_tokens",
        )
        _check(self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be in [0, 20]")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1


class LoraRequest(msgspec.Struct, kw_only=True, frozen=True):
    """A LoRA adapter for one diffusion request: its name, its file (a PEFT / diffusers safetensors file or
    the directory holding it; the server fills it from its registry), and the scale it applies at."""

    name: str
    path: str | None = None
    scale: float = 1.0


class DiffusionParams(msgspec.Struct, kw_only=True, omit_defaults=True, tag=True):
    """Generation settings for diffusion stages. `None` means: the pipeline's own default.

    Rules that depend on the model (size multiples, Wan's 4n+1 frames, which guidance knobs exist) are checked
    by the diffusion engine against the loaded pipeline; the rules here hold for every model.
    """

    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    num_frames: int | None = None
    fps: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    # A two-expert video model's low-noise expert has its own guidance scale.
    guidance_scale_2: float | None = None
    # Where (a fraction of the training timesteps) a two-expert model hands over to its low-noise expert.
    boundary_ratio: float | None = None
    # The flow-matching shift of the model's scheduler (its sampling schedule), for this request only.
    flow_shift: float | None = None
    true_cfg_scale: float | None = None
    seed: int | None = None
    num_outputs: int = 1
    # Text-encoder sequence length (pipelines pad prompts to it); None: the pipeline's default.
    max_sequence_length: int | None = None
    # Input images for edit / image-to-video: PIL images, uint8 HWC arrays or encoded bytes.
    image: list[Any] | None = None
    mask: Any = None
    # png | jpeg | webp | mp4 | wav: uint8 media (the server encodes it); tensor: float32 in [0, 1].
    output_format: str | None = None
    # Step caching: None, "cache_dit" or "teacache", with its options.
    cache: str | None = None
    cache_options: dict[str, Any] = msgspec.field(default_factory=dict)
    # Extra keyword arguments passed to the diffusers pipeline call.
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    # A LoRA adapter applied to this request only (stages/diffusion/lora.py).
    lora: LoraRequest | None = None

    def __post_init__(self) -> None:
        for name in ("height", "width", "num_frames", "fps", "num_inference_steps", "max_sequence_length"):
            value = getattr(self, name)
            _check(value is None or value >= 1, name, "must be >= 1")
        _check(self.num_outputs >= 1, "num_outputs", "must be >= 1")
        for name in ("guidance_scale", "guidance_scale_2", "true_cfg_scale"):
            value = getattr(self, name)
            _check(value is None or value >= 0, name, "must be >= 0")
        _check(
            self.boundary_ratio is None or 0 < self.boundary_ratio < 1, "boundary_ratio", "must be in (0, 1)"
        )
        _check(self.flow_shift is None or self.flow_shift > 0, "flow_shift", "must be > 0")
        _check(self.seed is None or 0 <= self.seed < 2**63, "seed", "must be in [0, 2**63)")
        _check(self.cache in (None, "cache_dit", "teacache"), "cache", "must be one of cache_dit, teacache")
        _check(not self.cache_options or self.cache is not None, "cache_options", "needs cache to be set")
        _check(
            self.output_format in (None, "png", "jpeg", "webp", "mp4", "wav", "tensor"),
            "output_format",
            "must be one of png, jpeg, webp, mp4, wav, tensor",
        )


class GenerationParams(msgspec.Struct, kw_only=True, omit_defaults=True, tag=True):
    """Settings for single-pass generation stages (vocoders, codec decoders)."""

    seed: int | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)


StageParams = SamplingParams | DiffusionParams | GenerationParams


def params_class(kind: str) -> type[StageParams]:
    """The parameter type a stage kind takes."""
    return {"ar": SamplingParams, "diffusion": DiffusionParams}.get(str(kind), GenerationParams)


@functools.cache
def _fields(cls: type) -> tuple[msgspec.structs.FieldInfo, ...]:
    """A params class's fields (msgspec resolves their annotations on every call: once is enough)."""
    return msgspec.structs.fields(cls)


def named_fields(params: StageParams) -> dict[str, Any]:
    """The fields a params object sets away from its class defaults: what it "names" when layered."""
    named = {}
    for field in _fields(type(params)):
        value = getattr(params, field.name)
        default = field.default_factory() if field.default_factory is not msgspec.NODEFAULT else field.default
        if field.required or (value is not None if default is None else value != default):
            named[field.name] = value
    return named


def layer_params(cls: type[StageParams], *layers: Mapping[str, Any] | StageParams | None) -> StageParams:
    """Pipeline defaults < deploy defaults < request, field by field: each layer changes only the fields it
    names (a mapping names its keys, a params object the fields it sets away from the class defaults, so a
    mapping is the way to set a field back to its class default over a default that changed it).

    The one place this rule lives: the API, the AR stage and the diffusion stage all call it.
    """
    fields: dict[str, Any] = {}
    for layer in layers:
        if layer is None:
            continue
        if isinstance(layer, msgspec.Struct):
            if not isinstance(layer, cls):
                raise InvalidRequestError(
                    f"params: expected {cls.__name__}, got {type(layer).__name__}", param="params"
                )
            layer = named_fields(layer)
        fields.update(layer)
    try:
        return cls(**fields)
    except TypeError as exc:
        raise InvalidRequestError(f"params: {exc}", param="params") from exc


def apply_constraints(params: Any, constraints: dict[str, Any]) -> Any:
    """A model's fixed parameters on top of a request's: scalars win, lists (e.g. codec stop ids) are
    extended. Idempotent, so the API and the engine may both apply it."""
    changes = {}
    for key, value in constraints.items():
        current = getattr(params, key)
        if isinstance(value, list) and isinstance(current, list):
            value = list(dict.fromkeys([*current, *value]))
        changes[key] = value
    return msgspec.structs.replace(params, **changes)
