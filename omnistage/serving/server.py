"""Running the server: build the runtimes, serve HTTP, shut down gracefully.

On SIGTERM (or SIGINT) the server stops admitting (new requests get 503, `/health` turns 503 so a load
balancer drains it), lets in-flight requests finish for `shutdown_grace_s`, cancels what remains (which
aborts those requests in every stage), fails running video jobs with a reason, and stops every stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import uvicorn

from omnistage.serving.app import create_app
from omnistage.serving.guards import ServerState
from omnistage.serving.settings import ServerSettings

logger = logging.getLogger(__name__)


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.drain_state = state

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.drain_state.draining = True
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Like uvicorn's, minus re-raising the signal afterwards: that would kill the process before
        the stages are stopped (and turn a clean shutdown into exit status -15)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


async def serve_async(
    models: Sequence[Any],
    settings: ServerSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_names: Sequence[str] | None = None,
    omni_kwargs: dict[str, Any] | None = None,
    log_level: str = "info",
) -> None:
    """Serve `models` until a signal stops the server: model directories, PipelineSpecs, or
    (PipelineSpec, model directory) pairs for user pipelines over a checkpoint."""
    state = ServerState()
    runtimes: dict[str, Any] = {}
    try:
        started = await _start_together(models, omni_kwargs or {})
        for index, omni in enumerate(started):
            name = served_model_names[index] if served_model_names else omni.model_name
            if name in runtimes:
                for other in started[index:]:
                    await other.shutdown()
                raise ValueError(f"two served models are named {name!r}; pass --served-model-name")
            runtimes[name] = omni
        _one_thread_when_routing_only(runtimes.values())
        app = create_app(runtimes, settings, state)
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=settings.shutdown_grace_s,
            access_log=False,
        )
        await _DrainingServer(config, state).serve()
    finally:
        for name, omni in runtimes.items():
            logger.info("stopping %s", name)
            try:
                await omni.shutdown()
            except Exception:
                logger.exception("shutdown of %s failed", name)


async def _start_together(models: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
    """Every model's runtime, started at once (each start blocks its thread until its stages are ready),
    so a server of several models waits for the slowest rather than for the sum where cores are free
    (measured on 2 cores, where loading is CPU-bound: the voice demo set's four models 41 s together,
    43 s one after another). If one fails, the others are stopped and its error is raised."""

    from omnistage.api import AsyncOmni

    def start(model: Any) -> Any:
        model, model_dir = model if isinstance(model, tuple) else (model, None)
        return AsyncOmni(model, model_dir=model_dir, **kwargs)

    results = await asyncio.gather(*(asyncio.to_thread(start, m) for m in models), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        for ok in results:
            if not isinstance(ok, BaseException):
                await ok.shutdown()
        raise failures[0]
    return list(results)


def _one_thread_when_routing_only(runtimes: Any) -> None:
    """When every stage runs in its own process, this process only routes: its torch work is small copies
    (joining a request's audio chunks), where a second OpenMP thread only spins on a core the stages need
    (measured: the server's CPU per streamed speech request 19 -> 8 ms). Inline stages keep the threads."""
    deploys = [omni.deploy.stage(s.stage_id) for omni in runtimes for s in omni.pipeline.stages]
    if deploys and all(d.placement != "inline" for d in deploys):
        import torch

        torch.set_num_threads(1)


def serve(models: Sequence[Any], settings: ServerSettings, **kwargs: Any) -> None:
    """On uvloop where it is installed (uvicorn[standard]; what uvicorn itself would pick): a cheaper event
    loop for the many small messages a streaming response is made of."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve_async(models, settings, **kwargs))
        return
    uvloop.run(serve_async(models, settings, **kwargs))
