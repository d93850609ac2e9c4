"""The video job store: records on disk, restart semantics, pagination, deletion."""

import pytest

from omnistage.errors import NotFoundError
from omnistage.serving.video_jobs import VideoJobStore

pytestmark = pytest.mark.unit


def make_jobs(store: VideoJobStore, count: int) -> list:
    jobs = []
    for i in range(count):
        job = store.create(model="m", prompt=f"p{i}", size="64x64", seconds="1")
        jobs.append(job)
    return jobs


def test_completed_jobs_survive_a_restart_and_running_ones_come_back_failed(tmp_path):
    store = VideoJobStore(tmp_path)
    done, running, queued = make_jobs(store, 3)
    store.write_video(done, b"mp4 bytes")
    done.status, done.progress = "completed", 100
    running.status, running.progress = "in_progress", 40
    for job in (done, running):
        store.save(job)

    reloaded = VideoJobStore(tmp_path)
    assert reloaded.get(done.id).status == "completed"
    assert reloaded.video_path(done.id).read_bytes() == b"mp4 bytes"
    for job in (running, queued):
        again = reloaded.get(job.id)
        assert again.status == "failed"
        assert again.error.code == "server_restart" and "stopped" in again.error.message
    assert VideoJobStore(tmp_path).get(running.id).status == "failed"  # the failure was persisted


def test_list_orders_and_paginates(tmp_path):
    store = VideoJobStore(tmp_path)
    jobs = make_jobs(store, 5)
    page, more = store.list(after=None, limit=2, order="desc")
    assert [j.id for j in page] == [jobs[4].id, jobs[3].id] and more
    page, more = store.list(after=jobs[3].id, limit=10, order="desc")
    assert [j.id for j in page] == [jobs[2].id, jobs[1].id, jobs[0].id] and not more
    page, more = store.list(after=None, limit=5, order="asc")
    assert [j.id for j in page] == [j.id for j in jobs] and not more
    with pytest.raises(NotFoundError) as info:
        store.list(after="video_nope", limit=1, order="asc")
    assert info.value.param == "after"


def test_delete_removes_record_and_file(tmp_path):
    store = VideoJobStore(tmp_path)
    (job,) = make_jobs(store, 1)
    store.write_video(job, b"x")
    store.delete(job.id)
    with pytest.raises(NotFoundError):
        store.get(job.id)
    assert list((tmp_path / "videos").iterdir()) == []
    assert VideoJobStore(tmp_path).jobs == {}


def test_unreadable_records_are_skipped(tmp_path):
    store = VideoJobStore(tmp_path)
    make_jobs(store, 1)
    (tmp_path / "videos" / "video_broken.json").write_text("{not json")
    assert len(VideoJobStore(tmp_path).jobs) == 1
