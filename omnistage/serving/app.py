"""The HTTP server: FastAPI app over one or more AsyncOmni pipelines."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from omnistage import __version__
from omnistage.api import AsyncOmni


def create_app(models: dict[str, AsyncOmni]) -> FastAPI:
    """`models` maps the served model name to its running pipeline."""
    app = FastAPI(title="omnistage", version=__version__)
    app.state.models = models
    created = int(time.time())

    @app.get("/health")
    async def health() -> JSONResponse:
        reports = {name: omni.health() for name, omni in models.items()}
        ok = all(r["ready"] for r in reports.values())
        return JSONResponse(
            {"status": "ok" if ok else "unavailable", "models": reports}, status_code=200 if ok else 503
        )

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "omnistage",
                "modalities": list(omni.pipeline.modalities),
            }
            for name, omni in models.items()
        ]
        return {"object": "list", "data": data}

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    return app
