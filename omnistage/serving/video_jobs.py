"""Video jobs that outlive a request and a server restart.

Generating a video takes minutes, so `POST /v1/videos` answers at once with a job and the work runs in
the background. Each job is a JSON file under `<storage_dir>/videos/` (written atomically) with its MP4
beside it, so completed jobs survive a restart; a job that was queued or running when the server died
comes back as failed with that reason instead of silently vanishing or hanging in `in_progress`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Literal

from omnistage.errors import NotFoundError
from omnistage.serving.protocol import VideoError, VideoJob

logger = logging.getLogger(__name__)

RESTART_ERROR = VideoError(code="server_restart", message="the server stopped while this job was running")


class VideoJobStore:
    def __init__(self, storage_dir: Path):
        self.root = Path(storage_dir) / "videos"
        self.root.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, VideoJob] = {}
        self._load()

    def _load(self) -> None:
        for path in sorted(self.root.glob("*.json")):
            try:
                job = VideoJob.model_validate_json(path.read_text())
            except (OSError, ValueError) as exc:
                logger.warning("ignoring unreadable video job %s: %s", path, exc)
                continue
            if job.status in ("queued", "in_progress"):
                job.status, job.error = "failed", RESTART_ERROR
                self.save(job)
            self.jobs[job.id] = job
        if self.jobs:
            logger.info("loaded %d video jobs from %s", len(self.jobs), self.root)

    def create(self, *, model: str, prompt: str, size: str, seconds: str) -> VideoJob:
        job = VideoJob(
            id=f"video_{time.time_ns():016x}{uuid.uuid4().hex[:12]}",  # sorts by creation time
            model=model,
            prompt=prompt,
            size=size,
            seconds=seconds,
            created_at=int(time.time()),
        )
        self.jobs[job.id] = job
        self.save(job)
        return job

    def save(self, job: VideoJob) -> None:
        """Atomic (write then rename), so a crash never leaves a half-written record."""
        path = self.root / f"{job.id}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(job.model_dump_json())
        os.replace(tmp, path)

    def get(self, video_id: str) -> VideoJob:
        job = self.jobs.get(video_id)
        if job is None:
            raise NotFoundError(f"Video {video_id!r} not found", param="video_id")
        return job

    def list(
        self, *, after: str | None, limit: int, order: Literal["asc", "desc"]
    ) -> tuple[list[VideoJob], bool]:
        jobs = sorted(self.jobs.values(), key=lambda j: j.id, reverse=order == "desc")
        if after is not None:
            ids = [j.id for j in jobs]
            if after not in ids:
                raise NotFoundError(f"Video {after!r} not found", param="after")
            jobs = jobs[ids.index(after) + 1 :]
        return jobs[:limit], len(jobs) > limit

    def video_path(self, video_id: str) -> Path:
        return self.root / f"{video_id}.mp4"

    def write_video(self, job: VideoJob, data: bytes) -> None:
        path = self.video_path(job.id)
        tmp = path.with_suffix(".mp4.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        job.file_name = path.name

    def delete(self, video_id: str) -> None:
        self.jobs.pop(video_id, None)
        for path in (self.video_path(video_id), self.root / f"{video_id}.json"):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
