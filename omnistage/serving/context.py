"""What every route needs from its server, reachable from the request."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from typing import Any

from fastapi import Request

from omnistage.serving.guards import ServerState
from omnistage.serving.loras import LoraRegistry
from omnistage.serving.media_sources import MediaSources
from omnistage.serving.metrics import ServerMetrics
from omnistage.serving.served import ServedModel, ServedModels
from omnistage.serving.settings import ServerSettings
from omnistage.serving.video_jobs import VideoJobStore
from omnistage.serving.voices import Voices


@dataclasses.dataclass
class ServerContext:
    settings: ServerSettings
    models: ServedModels
    metrics: ServerMetrics
    state: ServerState
    media: MediaSources
    videos: VideoJobStore
    voices: Voices
    loras: LoraRegistry = dataclasses.field(default_factory=LoraRegistry)
    video_tasks: dict[str, asyncio.Task] = dataclasses.field(default_factory=dict)
    sleeping: dict[str, set[int]] = dataclasses.field(default_factory=dict)  # model → stage ids asleep


async def get_context(request: Request) -> ServerContext:
    # async: FastAPI runs a plain-def dependency on its thread pool, a thread hop per request for a lookup
    return request.app.state.omnistage


async def model_health(model: ServedModel) -> dict[str, Any]:
    """`AsyncOmni.health()`, whether the runtime made it sync or async."""
    health = model.omni.health()
    health = await health if inspect.isawaitable(health) else health
    return json.loads(json.dumps(health, default=str))  # JSON-safe whatever the runtime put in it


def is_healthy(health: dict[str, Any]) -> bool:
    return bool(health.get("ready")) and all(s.get("alive", True) for s in health.get("stages", []))
