"""Running one runtime request on behalf of an HTTP request.

Whatever ends the HTTP side — the last output, a client that went away, a cancelled task at shutdown —
the runtime request must end too: every exit path that did not see the terminal output aborts it in all
stages. Aborting is shielded from cancellation, since it is exactly what runs while being cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import anyio
from starlette.requests import Request

from omnistage.errors import InvalidRequestError, NotReadyError, OmniError, StageDeadError, StageError
from omnistage.outputs import OmniRequestOutput
from omnistage.serving.metrics import ServerMetrics
from omnistage.serving.served import ServedModel

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the response was complete."""


async def generate(
    model: ServedModel,
    metrics: ServerMetrics,
    prompt: Any,
    params: Any,
    request_id: str,
    modalities: Sequence[str] | None = None,
) -> AsyncIterator[OmniRequestOutput]:
    """`AsyncOmni.generate`, plus metrics and abort-on-exit. Rejections (bad input, full admission)
    raise before the first output, as the runtime raises them."""
    start = time.perf_counter()
    saw_text = saw_audio = received = finished = rejected = False
    stream = model.omni.generate(prompt, params=params, request_id=request_id, modalities=modalities)
    metrics.in_flight.labels(model.name).inc()
    try:
        async for out in stream:
            received = True
            if not saw_text and (out.delta_token_ids or out.delta_text):
                saw_text = True
                metrics.ttft.labels(model.name).observe(time.perf_counter() - start)
            if not saw_audio and out.delta_audio is not None and out.delta_audio.numel() > 0:
                saw_audio = True
                metrics.ttfa.labels(model.name).observe(time.perf_counter() - start)
            if out.finished:
                finished = True
                metrics.finished.labels(model.name, out.finish_reason or "stop").inc()
            if out.error is not None:
                out.error = client_facing(out.error)
            yield out
            if finished:
                return
    except OmniError:
        rejected = not received
        raise
    finally:
        metrics.in_flight.labels(model.name).dec()
        if not finished and not rejected:
            with anyio.CancelScope(shield=True):
                await _abort(model, stream, request_id)
            metrics.finished.labels(model.name, "abort").inc()


def client_facing(error: OmniError) -> OmniError:
    """A stage that refused a request's input (an engine's InvalidRequestError) is the client's fault:
    400, not the 500 of a stage failure; a dead stage makes the model unavailable: 503."""
    if isinstance(error, StageDeadError):
        return NotReadyError(error.message)
    if isinstance(error, StageError) and error.exc_type == InvalidRequestError.__name__:
        where = f"stage {error.stage_id} ({error.stage_name})" if error.stage_name else "a stage"
        detail = error.message.split(f"{InvalidRequestError.__name__}: ", 1)[-1]
        return InvalidRequestError(f"{where} rejected the request: {detail}", param=error.param)
    return error


async def _abort(model: ServedModel, stream: AsyncIterator[Any], request_id: str) -> None:
    with contextlib.suppress(Exception):
        await stream.aclose()
    try:
        await model.omni.abort(request_id)
    except Exception:
        logger.exception("abort of %s failed", request_id)


async def last_output(outputs: AsyncIterator[OmniRequestOutput]) -> OmniRequestOutput:
    """The terminal output; a failed request raises its error (a typed OmniError)."""
    last = None
    async for out in outputs:
        last = out
    if last is None:
        raise OmniError("the runtime ended the request without a final output")
    if last.error is not None:
        raise last.error
    return last


async def collect(streams: Sequence[AsyncIterator[OmniRequestOutput]]) -> list[OmniRequestOutput]:
    """The terminal outputs of several requests run concurrently (n > 1, batched prompts), in order."""

    async def last(stream: AsyncIterator[OmniRequestOutput]) -> AsyncIterator[OmniRequestOutput]:
        yield await last_output(stream)

    outputs: list[Any] = [None] * len(streams)
    async for index, out in merge([last(s) for s in streams]):
        outputs[index] = out
    return outputs


async def wait_for_disconnect(request: Request) -> None:
    """Returns when the client has gone. Only valid once the body has been read."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Runs `work`, cancelling it (and so aborting its runtime request) if the client disconnects."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
                await task
        watcher.cancel()
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


_DONE = object()


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Interleave several streams as their items arrive, tagging each with its stream index (n > 1)."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item, None))
        except Exception as exc:
            await queue.put((index, None, exc))
        finally:
            queue.put_nowait((index, _DONE, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item, exc = await queue.get()
            if exc is not None:
                raise exc
            if item is _DONE:
                remaining -= 1
                continue
            yield index, item
    finally:
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)


async def _chain(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    yield first
    async for item in rest:
        yield item


async def prime(streams: Sequence[AsyncIterator[T]]) -> list[AsyncIterator[T]]:
    """Wait for every stream's first item, so that a rejection (bad input, full admission) becomes an
    HTTP error before a streaming response has started. If any stream fails, the others are closed
    (which aborts their requests) and the first failure is raised."""
    results = await asyncio.gather(*(anext(s) for s in streams), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        with anyio.CancelScope(shield=True):
            for stream, result in zip(streams, results, strict=True):
                if not isinstance(result, BaseException):
                    await stream.aclose()
        failure = failures[0]
        if isinstance(failure, StopAsyncIteration):
            raise OmniError("the runtime ended the request without any output")
        raise failure
    return [_chain(first, stream) for first, stream in zip(results, streams, strict=True)]
