"""Request fields → one params object per stage.

OpenAI-style requests carry one flat set of fields; a pipeline has several stages of different kinds.
Top-level sampling fields go to the entry AR stage (a talker keeps its own defaults), generation fields
to every diffusion stage, and `stage_params[i]` adds to (and overrides) what stage i gets.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from omnistage.config.capabilities import Limits
from omnistage.errors import InvalidRequestError
from omnistage.params import DiffusionParams, GenerationParams, SamplingParams, StageParams, params_class
from omnistage.serving.limits import check_generation, check_sampling
from omnistage.serving.served import ServedModel
from omnistage.serving.structured_outputs import structured_outputs_of

# Model-specific diffusion knobs refused here when the model does not declare them (the stage checks the
# others, and these again).
CHECKED_OPTIONS = ("flow_shift", "boundary_ratio")
_PATH = re.compile(r"at `\$\.?([^`]*)`")


# Fields only server-side code may set: they name code to import, pass arbitrary keyword arguments to a
# pipeline, or hold in-process objects. HTTP clients must not reach them.
PRIVATE_FIELDS = {
    "logits_processors",
    "extra",
    "return_hidden_states",
    "hidden_state_layers",
    "detokenize",
    "image",
    "mask",
    "output_format",
    "cache_options",
}


def make_params(
    cls: type[StageParams], fields: dict[str, Any], *, where: str, client: set[str] | None = None
) -> StageParams:
    """Construct with type checking; errors name the field (as `where.field` for a `stage_params` entry,
    whose `client` fields may not be private; all of them when not given)."""
    prefix = f"{where}." if where else ""
    private = sorted(set(fields if client is None else client) & PRIVATE_FIELDS) if where else []
    if private:
        field = f"{prefix}{private[0]}"
        raise InvalidRequestError(f"{field}: cannot be set over HTTP", param=field)
    unknown = sorted(set(fields) - set(cls.__struct_fields__))
    if unknown:
        raise InvalidRequestError(
            f"{prefix}{unknown[0]}: not a {cls.__name__} field (known: {', '.join(cls.__struct_fields__)})",
            param=f"{prefix}{unknown[0]}",
        )
    try:
        return msgspec.convert(fields, cls)
    except msgspec.ValidationError as exc:
        cause = exc.__cause__
        if isinstance(cause, InvalidRequestError):
            raise InvalidRequestError(f"{prefix}{cause.message}", param=f"{prefix}{cause.param}") from exc
        match = _PATH.search(str(exc))
        field = f"{prefix}{match.group(1)}" if match and match.group(1) else where or None
        raise InvalidRequestError(f"{field}: {str(exc).split(' - at ')[0]}", param=field) from exc


def build_stage_params(
    model: ServedModel,
    *,
    sampling: dict[str, Any] | None = None,
    diffusion: dict[str, Any] | None = None,
    generation: dict[str, Any] | None = None,
    stage_params: list[dict[str, Any] | None] | None = None,
    route_defaults: dict[str, Any] | None = None,
    limits: Limits | None = None,
    origins: dict[str, str] | None = None,
) -> list[dict[str, Any] | None]:
    """One entry per stage, in stage order: the fields the request names for it (None: that stage's
    defaults), checked but not yet layered over the defaults (the runtime does that, field by field).

    The model's `Capabilities.fields` says which stages get which group; `route_defaults` (e.g. chat's
    "no max_tokens: up to the context") apply to the sampling stages under the model's own defaults;
    `limits` are checked on what each stage would run, `origins` naming the request field of each value.
    """
    caps = model.capabilities
    stages = model.stages
    if stage_params is not None and len(stage_params) > len(stages):
        raise InvalidRequestError(
            f"stage_params has {len(stage_params)} entries but model {model.name!r} has {len(stages)} stages",
            param="stage_params",
        )
    for name in CHECKED_OPTIONS:
        if diffusion and diffusion.get(name) is not None and name not in caps.diffusion_options:
            param = (origins or {}).get(name, name)
            raise InvalidRequestError(f"{param}: model {model.name!r} does not take it", param=param)
    groups = {"sampling": sampling, "diffusion": diffusion, "generation": generation}
    result: list[dict[str, Any] | None] = []
    for index, stage in enumerate(stages):
        fields: dict[str, Any] = {}
        for group, values in groups.items():
            if values and stage.stage_id in caps.stages_for(group):
                fields.update(_as_stage_takes(group, values, stage.kind))
        named = {}
        if stage.stage_id in caps.stages_for("sampling") and route_defaults:
            named = model.default_fields(stage.stage_id)
            fields = {**{k: v for k, v in route_defaults.items() if k not in named}, **fields}
        override = stage_params[index] if stage_params and index < len(stage_params) else None
        where = f"stage_params[{index}]" if override is not None else ""
        params = {name: origin for name, origin in (origins or {}).items() if name in fields}
        if override is not None:
            fields.update(override)
            params.update({name: f"{where}.{name}" for name in override})
        if not fields:
            result.append(None)
            continue
        if limits is not None and limits.max_output_tokens and fields.get("max_tokens", 0) is None:
            fields["max_tokens"] = limits.max_output_tokens  # "as long as the context allows", capped
        checked = make_params(params_class(stage.kind), fields, where=where, client=set(override or ()))
        if limits is not None:
            _check_limits(model, stage.stage_id, checked, fields, limits, params)
        result.append({name: getattr(checked, name) for name in fields})
    return result


def _as_stage_takes(group: str, values: dict[str, Any], kind: str) -> dict[str, Any]:
    """A field group as the stage's kind takes it. The image and video routes' generation fields reach an
    AR stage (an AR→image hybrid writing image tokens) as its `seed` and `n`, the rest in `extra` for its
    family's input processor to read (and to refuse, naming the field, what the family cannot do)."""
    if group != "diffusion" or params_class(kind) is not SamplingParams:
        return values
    out: dict[str, Any] = {"seed": values["seed"]} if "seed" in values else {}
    if "num_outputs" in values:
        out["n"] = values["num_outputs"]
    rest = {k: v for k, v in values.items() if k not in ("seed", "num_outputs")}
    return {**out, "extra": rest} if rest else out


def _check_limits(
    model: ServedModel, sid: int, checked: Any, fields: dict[str, Any], limits: Limits, params: dict[str, str]
) -> None:
    values = {name: getattr(checked, name) for name in fields}
    if isinstance(checked, DiffusionParams):
        check_generation(values, model.default_fields(sid), limits, params)
    elif isinstance(checked, SamplingParams):
        check_sampling(values, limits, params.get("max_tokens", "max_tokens"))


def sampling_fields(request: Any, *, max_tokens: int | None) -> dict[str, Any]:
    """SamplingParams fields from a chat/completions request; only what the client set."""
    names = (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "min_tokens",
        "stop_token_ids",
        "seed",
    )
    fields = {name: getattr(request, name) for name in names if getattr(request, name, None) is not None}
    if request.stop is not None:
        fields["stop"] = [request.stop] if isinstance(request.stop, str) else list(request.stop)
    if request.ignore_eos:
        fields["ignore_eos"] = True
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    structured = structured_outputs_of(request)
    if structured is not None:
        fields["structured_outputs"] = structured
    return fields


__all__ = ["DiffusionParams", "GenerationParams", "SamplingParams", "build_stage_params", "make_params"]


def parse_size(size: str | None, *, param: str = "size") -> tuple[int, int] | None:
    """'WxH' -> (width, height); None or 'auto' -> None (the model's default)."""
    if size is None or size == "auto":
        return None
    width, _, height = size.partition("x")
    if not (width.isdigit() and height.isdigit()) or int(width) < 1 or int(height) < 1:
        raise InvalidRequestError(f"{param}: {size!r} is not WIDTHxHEIGHT (e.g. 512x512)", param=param)
    return int(width), int(height)


def diffusion_fields(
    request: Any,
    *,
    seed: int | None = None,
    num_outputs: int | None = None,
    images: list[Any] | None = None,
    mask: Any = None,
    num_frames: int | None = None,
    fps: int | None = None,
    lora: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """DiffusionParams fields from a request's generation fields (only what the client set); `lora` the
    adapter as the server resolved it (serving/loras.py)."""
    fields: dict[str, Any] = {}
    for name in (
        "negative_prompt",
        "num_inference_steps",
        "guidance_scale",
        "guidance_scale_2",
        "true_cfg_scale",
        "flow_shift",
        "boundary_ratio",
    ):
        value = getattr(request, name, None)
        if value is not None:
            fields[name] = value
    size = parse_size(getattr(request, "size", None))
    width, height = size if size else (getattr(request, "width", None), getattr(request, "height", None))
    optional = {
        "width": width,
        "height": height,
        "seed": seed,
        "num_outputs": num_outputs,
        "image": images or None,
        "mask": mask,
        "num_frames": num_frames,
        "fps": fps,
        "lora": lora,
    }
    fields.update({k: v for k, v in optional.items() if v is not None})
    return fields


def diffusion_origins(request: Any, **renamed: str) -> dict[str, str]:
    """Which request field each DiffusionParams field came from (`size` for both sides of a size)."""
    origins = {"width": "width", "height": "height"}
    if getattr(request, "size", None) not in (None, "auto"):
        origins = {"width": "size", "height": "size"}
    return {**origins, **renamed}
