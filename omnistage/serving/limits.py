"""Per-model request limits, checked before any work starts.

A model's limits (its family's `Capabilities.limits`, lowered or raised by the deploy YAML) meet the
server's global caps (`--max-generated-image-size`); the smaller wins. A request past one is a 400 that
names the field and the limit, so a 1024x1024 request to a 32x32 model never occupies a stage.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omnistage.config.capabilities import Limits
from omnistage.errors import InvalidRequestError
from omnistage.serving.settings import ServerSettings


def effective_limits(limits: Limits, settings: ServerSettings) -> Limits:
    """The model's limits under the server's global caps."""
    caps = {"max_pixels": settings.max_image_pixels, "max_upload_bytes": settings.max_request_bytes}
    lowered = {
        name: min(v for v in (getattr(limits, name), cap) if v is not None) for name, cap in caps.items()
    }
    return dataclasses.replace(limits, **lowered)


def _refuse(param: str, what: str, limit_name: str, limit: Any) -> None:
    raise InvalidRequestError(f"{param}: {what} exceeds this model's {limit_name} of {limit}", param=param)


def check_at_most(value: Any, limits: Limits, limit_name: str, param: str, what: str | None = None) -> None:
    limit = getattr(limits, limit_name)
    if value is not None and limit is not None and value > limit:
        _refuse(param, what or str(value), limit_name, limit)


def check_generation(
    fields: dict[str, Any], defaults: dict[str, Any], limits: Limits, params: dict[str, str]
) -> None:
    """A diffusion stage's fields (over its defaults) against the limits; `params` names the request
    field each came from (`size` for width and height given as a size)."""
    width = fields.get("width", defaults.get("width"))
    height = fields.get("height", defaults.get("height"))
    if width is not None or height is not None:
        # A side still unknown (the model's own default) is checked as a square.
        w, h = width or height, height or width
        side = "width" if "width" in fields else "height"
        param = params.get(side, side)
        check_at_most(w, limits, "max_width", param, f"width {w}")
        check_at_most(h, limits, "max_height", param, f"height {h}")
        check_at_most(w * h, limits, "max_pixels", param, f"{w}x{h} = {w * h} pixels")
    for name, limit_name in (("num_frames", "max_frames"), ("num_inference_steps", "max_steps")):
        value = fields.get(name)
        check_at_most(value, limits, limit_name, params.get(name, name), f"{name} {value}")


def check_sampling(fields: dict[str, Any], limits: Limits, param: str) -> None:
    value = fields.get("max_tokens")
    check_at_most(value, limits, "max_output_tokens", param, f"max_tokens {value}")


def check_upload(size: int, limits: Limits, param: str) -> None:
    check_at_most(size, limits, "max_upload_bytes", param, f"a file of {size} bytes")


def check_audio(samples: Any, sample_rate: int, limits: Limits, param: str) -> None:
    seconds = len(samples) / sample_rate
    check_at_most(seconds, limits, "max_audio_seconds", param, f"audio of {seconds:.2f} s")


def check_prompt_tokens(count: int, limits: Limits, param: str) -> None:
    check_at_most(count, limits, "max_input_tokens", param, f"a prompt of {count} tokens")
