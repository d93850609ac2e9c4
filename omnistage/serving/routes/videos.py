"""Video jobs: POST /v1/videos (JSON or multipart), GET/list/DELETE, and the MP4 download; and
POST /v1/videos/sync, the same request answered with the MP4 when it is made.

The job runs as a background task on the server's event loop; its progress is the diffusion engine's
step reports, and its record and file live in the `VideoJobStore` under `--storage-dir`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse, Response

from omnistage.errors import InvalidRequestError, NotFoundError, OmniError, OverloadedError
from omnistage.media import encode_video
from omnistage.outputs import OmniRequestOutput, Progress
from omnistage.serving.artifacts import DEFAULT_FPS, fps_of, sample_rate_of, videos_of
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.errors import ConflictError, SchemaError
from omnistage.serving.forms import files, multipart_openapi, read_form, text_fields
from omnistage.serving.generation import generate, last_output, unless_disconnected
from omnistage.serving.limits import check_upload
from omnistage.serving.media import decode_image
from omnistage.serving.protocol import VideoCreateRequest, VideoError, VideoJob
from omnistage.serving.served import ServedModel
from omnistage.serving.stage_params import build_stage_params, diffusion_fields, diffusion_origins

logger = logging.getLogger(__name__)
router = APIRouter()
CANCEL_WAIT_S = 2.0


def _create_openapi() -> dict[str, Any]:
    extra = multipart_openapi(VideoCreateRequest, {"input_reference": False})
    extra["requestBody"]["content"]["application/json"] = {"schema": VideoCreateRequest.model_json_schema()}
    return extra


async def _read_body(request: Request, ctx: ServerContext) -> tuple[VideoCreateRequest, bytes | None]:
    """The request and its reference image's bytes, from a JSON or a multipart body."""
    if request.headers.get("content-type", "").startswith("application/json"):
        try:
            raw = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SchemaError(f"request body is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise SchemaError("request body: expected a JSON object")
        body = VideoCreateRequest.model_validate(raw)
        reference = None
        if body.input_reference:
            reference, _ = await ctx.media.read(body.input_reference, param="input_reference")
        return body, reference
    form = await read_form(request)
    body = VideoCreateRequest.model_validate(
        text_fields(form, {"input_reference"}, frozenset({"stage_params", "lora"}))
    )
    uploads = await files(form, "input_reference")
    return body, uploads[0][1] if uploads else None


async def _video_request(
    request: Request, ctx: ServerContext, route: str
) -> tuple[ServedModel, VideoCreateRequest, list]:
    """The model, the request and its per-stage params, checked before any work starts."""
    body, data = await _read_body(request, ctx)
    model = ctx.models.get(body.model, produces=["video"], route=route, serves="videos")
    limits = model.limits(ctx.settings)
    reference = None
    if data is not None:
        check_upload(len(data), limits, "input_reference")
        reference = decode_image(data, max_pixels=ctx.settings.max_image_pixels, param="input_reference")
    if not body.prompt.strip():
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    fps = body.fps
    num_frames = body.num_frames
    if num_frames is None and body.seconds is not None:
        num_frames = int(body.seconds) * (fps or DEFAULT_FPS)
        fps = fps or DEFAULT_FPS
        if num_frames > 1024:
            raise InvalidRequestError(
                f"seconds: {body.seconds} s at {fps} fps exceeds 1024 frames", param="seconds"
            )
    fields = diffusion_fields(
        body,
        seed=body.seed,
        images=[reference] if reference is not None else None,
        num_frames=num_frames,
        fps=fps,
        lora=ctx.loras.for_model(model, body.lora),
    )
    origins = diffusion_origins(body, num_frames="num_frames" if body.num_frames else "seconds")
    params = build_stage_params(
        model,
        diffusion=fields,
        stage_params=body.stage_params,
        limits=limits,
        origins=origins,
    )
    return model, body, params


@router.post("/v1/videos", openapi_extra=_create_openapi())
async def create_video(request: Request, ctx: ServerContext = Depends(get_context)) -> dict:
    model, body, params = await _video_request(request, ctx, "/v1/videos")
    _check_admission(model)
    size = body.size or (f"{body.width}x{body.height}" if body.width and body.height else "auto")
    job = ctx.videos.create(model=model.name, prompt=body.prompt, size=size, seconds=body.seconds or "auto")
    ctx.video_tasks[job.id] = asyncio.ensure_future(_run_job(ctx, model, job, body.prompt, params))
    return job.model_dump()


@router.post("/v1/videos/sync", openapi_extra=_create_openapi())
async def create_video_sync(request: Request, ctx: ServerContext = Depends(get_context)) -> Response:
    """The same request as `POST /v1/videos`, answered with the MP4 itself once it is made (vLLM-Omni's
    route for clients that would rather wait than poll); a client that leaves aborts it."""
    model, body, params = await _video_request(request, ctx, "/v1/videos/sync")
    request_id = f"video_{uuid.uuid4().hex}"
    start = time.perf_counter()
    stream = generate(model, ctx.metrics, body.prompt, params, request_id, ["video"])
    out = await unless_disconnected(request, last_output(stream))
    videos = videos_of(out)
    if not videos:
        raise OmniError("the model did not produce a video")
    data = await asyncio.to_thread(encode_video, videos[0], fps_of(out), **soundtrack_of(out))
    headers = {"x-request-id": request_id, "x-inference-time-s": f"{time.perf_counter() - start:.3f}"}
    return Response(data, media_type="video/mp4", headers=headers)


def soundtrack_of(out: OmniRequestOutput, index: int = 0) -> dict[str, Any]:
    """The `index`-th clip's sound track as `encode_video` takes it (`audio`, `sample_rate`), where the model
    made one with its frames (LTX-2); none otherwise. Every channel of every clip is in `outputs["audios"]`
    where there is more than one of either, else `audio` is the one clip's mono track."""
    if out.audio is None:
        return {}
    audios = out.outputs.get("audios")
    audio = audios[index] if audios is not None else out.audio
    return {"audio": audio, "sample_rate": sample_rate_of(out)}


def _check_admission(model: ServedModel) -> None:
    """A job runs in the background, so a full admission queue would only show later as a failed job;
    refuse it now with 429 instead, as the other routes do."""
    omni = model.omni
    if omni.num_inflight >= omni.max_queued_requests:
        raise OverloadedError(f"{omni.num_inflight} requests in flight (limit {omni.max_queued_requests})")


async def _run_job(ctx: ServerContext, model: ServedModel, job: VideoJob, prompt: str, params: list) -> None:
    start = time.perf_counter()
    try:
        async for out in generate(model, ctx.metrics, prompt, params, job.id, ["video"]):
            if out.error is not None:
                raise out.error
            if out.progress and not out.finished:
                _report_progress(ctx, job, out.progress)
            if out.finished:
                await _complete(ctx, job, out, time.perf_counter() - start)
    except asyncio.CancelledError:
        if job.id in ctx.videos.jobs:  # cancelled by shutdown, not by DELETE (which removes the job first)
            _fail(ctx, job, "cancelled", "the server shut down while this job was running")
        raise
    except OmniError as exc:
        _fail(ctx, job, exc.error_type, exc.message)
    except Exception as exc:
        logger.exception("video job %s failed", job.id)
        _fail(ctx, job, "internal_error", f"{type(exc).__name__}: {exc}")
    finally:
        ctx.video_tasks.pop(job.id, None)


def _report_progress(ctx: ServerContext, job: VideoJob, progress: Progress) -> None:
    percent = min(99, int(100 * progress.step / max(progress.total, 1)))
    if job.status == "queued" or percent != job.progress:
        job.status, job.progress = "in_progress", max(job.progress, percent)
        ctx.videos.save(job)


async def _complete(ctx: ServerContext, job: VideoJob, out: Any, elapsed: float) -> None:
    videos = videos_of(out)
    if not videos:
        raise OmniError("the model did not produce a video")
    video, fps = videos[0], fps_of(out)
    data = await asyncio.to_thread(encode_video, video, fps, **soundtrack_of(out))
    if job.id not in ctx.videos.jobs:
        return  # deleted while encoding
    ctx.videos.write_video(job, data)
    frames, height, width = video.shape[:3]
    job.status, job.progress, job.completed_at = "completed", 100, int(time.time())
    job.size, job.seconds = f"{width}x{height}", f"{frames / fps:g}"
    job.inference_time_s = round(elapsed, 3)
    ctx.videos.save(job)


def _fail(ctx: ServerContext, job: VideoJob, code: str, message: str) -> None:
    if job.id in ctx.videos.jobs:
        job.status, job.error = "failed", VideoError(code=code, message=message)
        ctx.videos.save(job)


@router.get("/v1/videos")
async def list_videos(
    after: str | None = None,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
    ctx: ServerContext = Depends(get_context),
) -> dict:
    jobs, has_more = ctx.videos.list(after=after, limit=limit, order=order)
    data = [j.model_dump() for j in jobs]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


@router.get("/v1/videos/{video_id}")
async def get_video(video_id: str, ctx: ServerContext = Depends(get_context)) -> dict:
    return ctx.videos.get(video_id).model_dump()


@router.get("/v1/videos/{video_id}/content")
async def video_content(
    video_id: str,
    variant: Literal["video"] = "video",
    ctx: ServerContext = Depends(get_context),
) -> FileResponse:
    job = ctx.videos.get(video_id)
    if job.status == "failed":
        raise SchemaError("Video generation failed; check the job's error for details", param="video_id")
    if job.status != "completed":
        raise NotFoundError(f"Video {video_id!r} is still {job.status.replace('_', ' ')}", param="video_id")
    path = ctx.videos.video_path(video_id)
    if not path.exists():
        raise NotFoundError(f"the file of video {video_id!r} is missing", param="video_id")
    return FileResponse(path, media_type="video/mp4", filename=f"{video_id}.mp4")


@router.delete("/v1/videos/{video_id}")
async def delete_video(video_id: str, ctx: ServerContext = Depends(get_context)) -> dict:
    job = ctx.videos.get(video_id)
    task = ctx.video_tasks.get(video_id)
    ctx.videos.jobs.pop(video_id, None)  # first, so the cancelled task knows it was deleted
    if task is not None and not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(task), CANCEL_WAIT_S)
        if not task.done():
            ctx.videos.jobs[video_id] = job
            raise ConflictError("cancellation in progress; try again later", param="video_id")
    ctx.videos.delete(video_id)
    return {"id": video_id, "object": "video.deleted", "deleted": True}


async def cancel_all(ctx: ServerContext) -> None:
    """At shutdown: cancel running jobs (each records itself as failed) and wait for them."""
    tasks = list(ctx.video_tasks.values())
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
