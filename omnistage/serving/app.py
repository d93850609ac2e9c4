"""The FastAPI application: one or more `AsyncOmni` runtimes behind OpenAI-compatible routes.

`create_app` only wires things together; the runtimes are created (and shut down) by whoever owns the
process — `omnistage.serving.server.serve` for `omnistage serve`.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI

from omnistage import __version__
from omnistage.serving.context import ServerContext
from omnistage.serving.errors import document_400, install_error_handlers
from omnistage.serving.guards import RequestGuard, ServerState
from omnistage.serving.loras import LoraRegistry
from omnistage.serving.media_sources import MediaSources
from omnistage.serving.metrics import MetricsMiddleware, ServerMetrics
from omnistage.serving.routes import (
    audio_generate,
    chat,
    completions,
    images,
    lora_adapters,
    omni_control,
    playground,
    speech,
    speech_batch,
    speech_stream,
    transcriptions,
    videos,
)
from omnistage.serving.routes import models as model_routes
from omnistage.serving.routes import realtime as realtime_routes
from omnistage.serving.routes import voices as voice_routes
from omnistage.serving.served import ServedModels
from omnistage.serving.settings import ServerSettings
from omnistage.serving.video_jobs import VideoJobStore
from omnistage.serving.voices import Voices, VoiceStore

if TYPE_CHECKING:
    from omnistage.api import AsyncOmni

logger = logging.getLogger(__name__)


def create_app(
    models: Mapping[str, AsyncOmni] | Sequence[AsyncOmni],
    settings: ServerSettings | None = None,
    state: ServerState | None = None,
) -> FastAPI:
    """An app serving `models` (name → runtime, or runtimes named by their `model_name`)."""
    settings = settings or ServerSettings()
    scratch: list[Path] = []  # directories this app made for itself: removed when it stops
    storage = settings.storage_dir
    if storage is None:
        storage = Path(tempfile.mkdtemp(prefix="omnistage-storage-"))
        scratch.append(storage)
        logger.warning("no --storage-dir given: video jobs live in %s and do not survive a restart", storage)
    voices_dir = settings.voices_dir
    if voices_dir is None:
        voices_dir = Path(tempfile.mkdtemp(prefix="omnistage-voices-"))
        scratch.append(voices_dir)
        logger.warning("no --voices-dir given: uploaded voices in %s do not survive a restart", voices_dir)
    served = ServedModels(models)
    ctx = ServerContext(
        settings=settings,
        models=served,
        metrics=ServerMetrics(),
        state=state or ServerState(),
        media=MediaSources(settings),
        videos=VideoJobStore(storage),
        voices=Voices(served, VoiceStore(voices_dir, settings.max_uploaded_voices)),
        loras=LoraRegistry(settings.lora_modules, settings.allowed_local_media_path),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx.metrics.loop.start()
        yield
        await ctx.metrics.loop.stop()
        ctx.state.draining = True
        await videos.cancel_all(ctx)
        for path in scratch:
            shutil.rmtree(path, ignore_errors=True)

    app = FastAPI(title="omnistage", version=__version__, lifespan=lifespan)
    app.state.omnistage = ctx
    install_error_handlers(app, settings.retry_after_s)
    app.include_router(realtime_routes.router)
    routes = (chat, completions, speech, speech_batch, speech_stream, voice_routes, audio_generate)
    for module in (*routes, transcriptions, images, videos, model_routes, omni_control, lora_adapters):
        app.include_router(module.router)
    if settings.playground:
        app.include_router(playground.router)
    document_400(app)
    open_paths = playground.OPEN_PATHS if settings.playground else frozenset()
    app.add_middleware(
        RequestGuard,
        settings=settings,
        state=ctx.state,
        open_paths=open_paths,
        on_slow_client=lambda kind: ctx.metrics.slow_clients.labels(kind).inc(),
    )
    app.add_middleware(MetricsMiddleware, metrics=ctx.metrics)  # outermost: counts rejected requests too
    return app
