"""POST /v1/audio/speech/batch: up to 32 inputs spoken concurrently, each succeeding or failing alone.

Every item is an ordinary `/v1/audio/speech` request (the batch's fields under the item's own), fanned out at
once so the stages batch them as they batch any concurrent requests. One bad item is that item's error in
the results; a client that goes away cancels them all, which aborts each in every stage.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from omnistage.errors import InvalidRequestError, OmniError
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.errors import field_path
from omnistage.serving.generation import unless_disconnected
from omnistage.serving.media import AUDIO_CONTENT_TYPES
from omnistage.serving.protocol import BatchSpeechRequest, SpeechRequest
from omnistage.serving.speech_requests import speak, speech_usage

logger = logging.getLogger(__name__)
router = APIRouter()
PATH = "/v1/audio/speech/batch"


def item_request(batch: BatchSpeechRequest, item: dict[str, Any]) -> SpeechRequest:
    """The item's fields over the batch's (only what the batch set)."""
    if "input" not in item:
        raise InvalidRequestError("input: every item needs an input", param="input")
    if item.get("stream") or item.get("stream_format"):
        raise InvalidRequestError("stream: batch items are answered whole, not streamed", param="stream")
    defaults = batch.model_dump(exclude_unset=True, exclude={"items"})
    return SpeechRequest.model_validate({**defaults, **item})


async def _item(index: int, batch: BatchSpeechRequest, item: dict[str, Any], ctx: ServerContext) -> dict:
    try:
        body = item_request(batch, item)
        model = ctx.models.get(body.model, produces=["audio"], route=PATH, serves="speech")
        out, data, rate = await speak(body, model, ctx, f"speech-{uuid.uuid4().hex}")
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = field_path(first.get("loc", ()))
        return _failed(index, f"{param}: {first['msg']}" if param else first["msg"], param)
    except OmniError as exc:
        return _failed(index, exc.message, exc.param)
    except Exception as exc:  # one item's fault is never the batch's
        logger.exception("batch item %d failed", index)
        return _failed(index, f"internal error ({type(exc).__name__})", None)
    return {
        "index": index,
        "status": "success",
        "audio_data": base64.b64encode(data).decode(),
        "media_type": AUDIO_CONTENT_TYPES[body.response_format],
        "sample_rate": rate,
        "usage": speech_usage(out),
    }


def _failed(index: int, message: str, param: str | None) -> dict:
    return {"index": index, "status": "error", "error": message, "param": param}


@router.post(PATH)
async def speech_batch(body: BatchSpeechRequest, request: Request, ctx: ServerContext = Depends(get_context)):
    work = asyncio.gather(*(_item(i, body, item, ctx) for i, item in enumerate(body.items)))
    results = await unless_disconnected(request, work)
    succeeded = sum(r["status"] == "success" for r in results)
    return {
        "id": f"speech-batch-{uuid.uuid4().hex}",
        "results": results,
        "total": len(results),
        "succeeded": succeeded,
        "failed": len(results) - succeeded,
    }
