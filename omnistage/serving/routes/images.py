"""POST /v1/images/generations (JSON) and POST /v1/images/edits (multipart), DALL-E compatible."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request

from omnistage.errors import InvalidRequestError, OmniError
from omnistage.media import encode_image
from omnistage.serving.artifacts import images_of
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.forms import files, multipart_openapi, read_form, text_fields
from omnistage.serving.generation import generate, last_output, unless_disconnected
from omnistage.serving.limits import check_upload
from omnistage.serving.media import decode_image
from omnistage.serving.protocol import ImageEditForm, ImageFields, ImageGenerationRequest
from omnistage.serving.served import ServedModel
from omnistage.serving.stage_params import build_stage_params, diffusion_fields, diffusion_origins

router = APIRouter()
EDIT_FILES = {"image": True, "image[]": True, "mask": False}


def _check(body: ImageFields) -> None:
    if body.response_format == "url":
        raise InvalidRequestError("response_format: only 'b64_json' is supported", param="response_format")
    if not body.prompt.strip():
        raise InvalidRequestError("prompt must not be empty", param="prompt")


def _model(request: Request, ctx: ServerContext, body: ImageFields) -> ServedModel:
    return ctx.models.get(body.model, produces=["image"], route=request.url.path, serves="images")


async def _run(
    request: Request, ctx: ServerContext, body: ImageFields, images=None, mask=None
) -> dict[str, Any]:
    model = _model(request, ctx, body)
    _check(body)
    size = body.size
    if (size is None or size == "auto") and images and body.width is None and body.height is None:
        size = "{}x{}".format(*images[0].size)  # edits default to the first input image's size
    body = body.model_copy(update={"size": size})
    fields = diffusion_fields(
        body,
        seed=body.seed,
        num_outputs=body.n if body.n > 1 else None,
        images=images,
        mask=mask,
        lora=ctx.loras.for_model(model, body.lora),
    )
    params = build_stage_params(
        model,
        diffusion=fields,
        stage_params=body.stage_params,
        limits=model.limits(ctx.settings),
        origins=diffusion_origins(body),
    )
    request_id = f"img-{uuid.uuid4().hex}"
    stream = generate(model, ctx.metrics, body.prompt, params, request_id, ["image"])
    out = await unless_disconnected(request, last_output(stream))
    results = images_of(out)
    if not results:
        raise OmniError("the model did not produce an image")
    fmt = "jpeg" if body.output_format == "jpg" else body.output_format
    height, width = results[0].shape[:2]
    quality = {} if body.output_compression is None else {"quality": body.output_compression}

    def encoded() -> list[dict[str, Any]]:  # off the event loop: large images take a while
        return [
            {"b64_json": base64.b64encode(encode_image(img, fmt, **quality)).decode(), "revised_prompt": None}
            for img in results
        ]

    data = await asyncio.to_thread(encoded)
    return {"created": int(time.time()), "data": data, "output_format": fmt, "size": f"{width}x{height}"}


@router.post("/v1/images/generations")
async def generations(
    body: ImageGenerationRequest, request: Request, ctx: ServerContext = Depends(get_context)
):
    return await _run(request, ctx, body)


@router.post("/v1/images/edits", openapi_extra=multipart_openapi(ImageEditForm, EDIT_FILES, ("image",)))
async def edits(request: Request, ctx: ServerContext = Depends(get_context)):
    form = await read_form(request)
    body = ImageEditForm.model_validate(
        text_fields(form, set(EDIT_FILES), frozenset({"stage_params", "lora"}))
    )
    limits = _model(request, ctx, body).limits(ctx.settings)
    uploads = await files(form, "image", "image[]")
    if not uploads:
        raise InvalidRequestError("image: at least one image file is required", param="image")
    uploads += [("mask", data) for _, data in await files(form, "mask")][:1]
    for name, data in uploads:
        check_upload(len(data), limits, name)
    pixels = ctx.settings.max_image_pixels
    decoded = await asyncio.to_thread(
        lambda: [decode_image(data, max_pixels=pixels, param=name) for name, data in uploads]
    )
    images = [image for (name, _), image in zip(uploads, decoded, strict=True) if name != "mask"]
    mask = next((image for (name, _), image in zip(uploads, decoded, strict=True) if name == "mask"), None)
    return await _run(request, ctx, body, images=images, mask=mask)
