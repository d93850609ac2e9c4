"""GET/POST /v1/audio/voices and DELETE /v1/audio/voices/{name}: each model's own voices, and uploads.

An upload must decode as audio (the server's own decoders, so any container FFmpeg reads) and stay under
the server's size and count limits; its name may not shadow a model's own voice, so a name always means
one voice.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request
from starlette.datastructures import UploadFile

from omnistage.errors import InvalidRequestError
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.forms import files, multipart_openapi, read_form, text_fields
from omnistage.serving.media import decode_audio
from omnistage.serving.protocol import VoiceUploadForm

router = APIRouter()
UPLOAD_FILES = {"audio_sample": False}


@router.get("/v1/audio/voices")
async def list_voices(model: str | None = None, ctx: ServerContext = Depends(get_context)) -> dict:
    """`voices`: every name a request may use (the models' own, aliases included, and the uploads);
    `models`: per model its voices, which names are aliases of which voice, and whether it clones."""
    if model is not None:
        ctx.models.get(model)  # 404 for an unknown model
    models = [v for name, v in ctx.voices.models.items() if model is None or name == model]
    uploaded = ctx.voices.store.list()
    names = {v for m in models for v in m.voices} | {v.name for v in uploaded}
    return {
        "voices": sorted(names),
        "uploaded_voices": [v.describe() for v in uploaded],
        "models": [m.describe() for m in models],
    }


@router.post(
    "/v1/audio/voices", openapi_extra=multipart_openapi(VoiceUploadForm, UPLOAD_FILES, ("audio_sample",))
)
async def upload_voice(request: Request, ctx: ServerContext = Depends(get_context)) -> dict:
    form = await read_form(request)
    body = VoiceUploadForm.model_validate(text_fields(form, set(UPLOAD_FILES)))
    uploads = await files(form, "audio_sample")
    if not uploads:
        raise InvalidRequestError("audio_sample: an audio file is required", param="audio_sample")
    data = uploads[0][1]
    limit = ctx.settings.max_voice_upload_bytes
    if len(data) > limit:
        raise InvalidRequestError(
            f"audio_sample: a file of {len(data)} bytes exceeds the voice upload limit of {limit} bytes",
            param="audio_sample",
        )
    if body.name in ctx.voices.builtin():
        raise InvalidRequestError(
            f"name: {body.name!r} is a served model's own voice; choose another name", param="name"
        )
    samples, rate = await asyncio.to_thread(decode_audio, data, param="audio_sample")
    if not samples.size:
        raise InvalidRequestError("audio_sample: the file holds no audio samples", param="audio_sample")
    upload = form.get("audio_sample")
    declared = upload.content_type if isinstance(upload, UploadFile) else None
    mime_type = declared or "application/octet-stream"
    voice = ctx.voices.store.add(
        body.name,
        samples,
        rate,
        consent=body.consent,
        mime_type=mime_type,
        file_size=len(data),
        ref_text=body.ref_text,
    )
    return {"success": True, "voice": voice.describe()}


@router.delete("/v1/audio/voices/{name}")
async def delete_voice(name: str, ctx: ServerContext = Depends(get_context)) -> dict:
    ctx.voices.store.delete(name)
    return {"success": True, "message": f"voice {name!r} deleted"}
