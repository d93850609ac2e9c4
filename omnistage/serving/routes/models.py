"""Server-level routes: the model list, health, version and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from omnistage import __version__
from omnistage.serving.context import ServerContext, get_context, is_healthy, model_health

router = APIRouter()


@router.get("/v1/models")
async def list_models(ctx: ServerContext = Depends(get_context)) -> dict:
    return {"object": "list", "data": ctx.models.describe()}


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, ctx: ServerContext = Depends(get_context)) -> dict:
    ctx.models.get(model_id)
    return next(m for m in ctx.models.describe() if m["id"] == model_id)


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
    for model in ctx.models:
        ctx.metrics.observe_stages(model.name, await model.omni.stats(), await model_health(model))
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)
