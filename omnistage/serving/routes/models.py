"""Server-level routes: the model list, health, version and Prometheus metrics."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import msgspec
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from omnistage import __version__
from omnistage.serving.context import ServerContext, get_context, is_healthy, model_health
from omnistage.serving.routes import realtime
from omnistage.serving.served import ServedModel

router = APIRouter()


def capabilities_block(model: ServedModel, ctx: ServerContext) -> dict[str, Any]:
    """What a client needs to offer only requests the model can answer (the playground builds its panels
    from it): its routes and output modalities, its limits under the server's caps, how it speaks. A chat
    model that does not hear audio lists `realtime` while a served model transcribes for it."""
    caps = model.capabilities
    speaks = ctx.voices.models.get(model.name)  # None for a model that does not speak
    routes = list(caps.routes)
    if realtime.ROUTE not in routes and realtime.offers_sessions(ctx, model):
        routes.append(realtime.ROUTE)
    return {
        "routes": routes,
        "modalities": list(model.modalities),
        "default_modalities": model.default_modalities(),
        "prompt": caps.prompt,
        "limits": dataclasses.asdict(model.limits(ctx.settings)),
        "voices": speaks.describe()["voices"] if speaks else [],  # with the checkpoint's own
        "speed_range": list(caps.speed_range) if caps.speed_range else None,
        "clones_voices": caps.clones_voices,
        "diffusion_options": list(caps.diffusion_options),
        "speech_options": [
            {"name": o.name, "schema": msgspec.json.schema(o.type), "description": o.description}
            for o in caps.speech_options
        ],
    }


def _described(ctx: ServerContext) -> list[dict[str, Any]]:
    """The OpenAI model objects, each with an `omnistage` block of its capabilities."""
    return [
        {**entry, "omnistage": capabilities_block(model, ctx)}
        for entry, model in zip(ctx.models.describe(), ctx.models, strict=True)
    ]


@router.get("/v1/models")
async def list_models(ctx: ServerContext = Depends(get_context)) -> dict:
    return {"object": "list", "data": _described(ctx)}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, ctx: ServerContext = Depends(get_context)) -> dict:
    ctx.models.get(model_id)
    return next(m for m in _described(ctx) if m["id"] == model_id)


@router.get("/health")
async def health(ctx: ServerContext = Depends(get_context)) -> JSONResponse:
    """503 while shutting down or while any stage of any model is not ready or dead."""
    if ctx.state.draining:
        return JSONResponse({"status": "unhealthy", "reason": "shutting down"}, status_code=503)
    models = {m.name: await model_health(m) for m in ctx.models}
    healthy = all(is_healthy(h) for h in models.values())
    body = {"status": "healthy" if healthy else "unhealthy", "models": models}
    return JSONResponse(body, status_code=200 if healthy else 503)


@router.get("/version")
async def version() -> dict:
    return {"version": __version__}


@router.get("/metrics")
async def metrics(ctx: ServerContext = Depends(get_context)) -> Response:
    # Every model's runtime answers on its own threads: ask them all at once, so a scrape takes as long
    # as the slowest model, not the sum (a poller sees a stage go idle sooner).
    models = list(ctx.models)
    stats = await asyncio.gather(*(model.omni.stats() for model in models))
    states = await asyncio.gather(*(model_health(model) for model in models))
    for model, model_stats, state in zip(models, stats, states, strict=True):
        ctx.metrics.observe_stages(model.name, model_stats, state)
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)
