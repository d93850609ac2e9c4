"""Image generation/editing and the video job lifecycle through the official openai client."""

import base64
import io

import numpy as np
import openai
import pytest
from PIL import Image

from omnistage.media import encode_image, encode_video
from omnistage.params import DiffusionParams
from omnistage.serving import media
from tests.support.polling import wait_until
from tests.support.toy_stages import open_gate

pytestmark = pytest.mark.e2e


def decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


def test_images_generate_equals_offline_and_is_seeded(client, reference):
    reply = client.images.generate(
        model="toy-image", prompt="a fox", n=2, size="16x8", extra_body={"seed": 5, "num_inference_steps": 2}
    )
    expected = reference.run(
        "toy-image",
        "a fox",
        DiffusionParams(width=16, height=8, seed=5, num_inference_steps=2, num_outputs=2),
    )
    assert [decode(d.b64_json).shape for d in reply.data] == [(8, 16, 3), (8, 16, 3)]
    for got, want in zip(reply.data, expected.images, strict=True):
        assert np.array_equal(decode(got.b64_json), np.asarray(want))
    assert reply.size == "16x8" and reply.output_format == "png"
    other = client.images.generate(
        model="toy-image", prompt="a fox", size="16x8", extra_body={"seed": 6, "num_inference_steps": 2}
    )
    assert not np.array_equal(decode(other.data[0].b64_json), decode(reply.data[0].b64_json))


@pytest.mark.parametrize("fmt", ["jpeg", "webp"])
def test_images_output_formats(client, fmt):
    reply = client.images.generate(
        model="tiny-flux1",
        prompt="a fox",
        size="32x32",
        output_format=fmt,
        extra_body={"num_inference_steps": 1},
    )
    assert Image.open(io.BytesIO(base64.b64decode(reply.data[0].b64_json))).format == fmt.upper()


def test_images_edit_uses_the_uploaded_image(client, reference):
    source = np.zeros((8, 16, 3), dtype=np.uint8)
    source[:, :8] = 255
    png = encode_image(source)
    reply = client.images.edit(
        model="toy-image",
        image=("in.png", png, "image/png"),
        prompt="make it blue",
        extra_body={"seed": 1, "num_inference_steps": 2},
    )
    got = decode(reply.data[0].b64_json)
    assert got.shape == (8, 16, 3)  # size "auto": the input image's size
    params = DiffusionParams(
        width=16, height=8, seed=1, num_inference_steps=2, image=[Image.fromarray(source)]
    )
    assert np.array_equal(got, np.asarray(reference.run("toy-image", "make it blue", params).images[0]))
    plain = reference.run(
        "toy-image", "make it blue", DiffusionParams(width=16, height=8, seed=1, num_inference_steps=2)
    )
    assert not np.array_equal(got, np.asarray(plain.images[0]))


def test_image_errors(http):
    too_big = http.post("/v1/images/generations", json={"prompt": "x", "size": "128x128"})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "size"
    assert "exceeds" in too_big.json()["error"]["message"] and "4096" in too_big.json()["error"]["message"]
    url = http.post("/v1/images/generations", json={"prompt": "x", "response_format": "url"})
    assert url.status_code == 400 and url.json()["error"]["param"] == "response_format"
    wrong_model = http.post("/v1/images/generations", json={"prompt": "x", "model": "toy-omni"})
    assert wrong_model.status_code == 400
    assert "does not serve /v1/images" in wrong_model.json()["error"]["message"]
    no_image = http.post("/v1/images/edits", data={"prompt": "x"}, files={"mask": ("m.png", b"x")})
    assert no_image.status_code == 400 and no_image.json()["error"]["param"] == "image"
    bad_image = http.post("/v1/images/edits", data={"prompt": "x"}, files={"image": ("i.png", b"not png")})
    assert bad_image.status_code == 400 and bad_image.json()["error"]["param"] == "image"


def ended(job) -> bool:
    return job.status in ("completed", "failed")


def wait_for(client, video_id: str, condition=ended):
    """The job once `condition(job)` holds, and every (status, progress) seen until then."""
    seen = []

    def reached():
        job = client.videos.retrieve(video_id)
        seen.append((job.status, job.progress))
        return job if condition(job) else None

    return wait_until(reached, what=f"video {video_id}: {condition.__name__}"), seen


def running_with_progress(job) -> bool:
    return job.status == "in_progress" and job.progress > 0


def test_video_job_lifecycle(client, reference, gates):
    job = client.videos.create(
        model="toy-video",
        prompt="waves HOLD:lifecycle",  # held before its last step until the gate opens
        size="16x8",
        extra_body={"num_frames": 6, "num_inference_steps": 40, "seed": 2, "fps": 6},
    )
    assert job.status == "queued" and job.progress == 0 and job.object == "video"
    _, seen = wait_for(client, job.id, running_with_progress)
    with pytest.raises(openai.NotFoundError, match="still"):
        client.videos.download_content(job.id)
    open_gate(gates, "lifecycle")
    job, more = wait_for(client, job.id)
    seen += more
    assert job.status == "completed" and job.progress == 100, seen
    progress = [p for s, p in seen if s == "in_progress"]
    assert progress and progress == sorted(progress) and 0 < max(progress) < 100
    assert job.size == "16x8" and job.seconds == "1"
    mp4 = client.videos.download_content(job.id).content
    frames = media.decode_video(mp4, max_pixels=10**6, max_frames=100, param="v")
    expected = reference.run(
        "toy-video",
        "waves",
        DiffusionParams(width=16, height=8, num_frames=6, num_inference_steps=40, seed=2, fps=6),
    )
    want = expected.video.numpy()[0]
    assert frames.shape == want.shape
    # Lossy H.264: the served file decodes to exactly what encoding the reference frames here decodes to.
    local = media.decode_video(encode_video(want, 6), max_pixels=10**6, max_frames=100, param="v")
    np.testing.assert_array_equal(frames, local)


def test_a_sync_video_is_the_mp4_itself_json_or_multipart(http, client):
    """`POST /v1/videos/sync`: the same fields as a job, answered with the MP4 the job would have made (the
    server's encoder is deterministic within its process; the job's frames are checked against the pipeline
    by the lifecycle test), and no job is kept."""
    fields = {"model": "toy-video", "prompt": "waves", "size": "16x8", "num_frames": 6, "seed": 2, "fps": 6}
    fields["num_inference_steps"] = 3
    jobs_before = http.get("/v1/videos", params={"limit": 100}).json()["data"]
    as_json = http.post("/v1/videos/sync", json=fields)
    as_form = http.post("/v1/videos/sync", data={k: str(v) for k, v in fields.items()})
    for response in (as_json, as_form):
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == "video/mp4" and response.headers["x-request-id"]
    assert http.get("/v1/videos", params={"limit": 100}).json()["data"] == jobs_before
    job = client.videos.create(
        model="toy-video", prompt="waves", size="16x8", extra_body={k: fields[k] for k in SYNC_EXTRA}
    )
    job, _ = wait_for(client, job.id)
    assert job.status == "completed", job.error
    assert as_json.content == as_form.content == client.videos.download_content(job.id).content
    frames = media.decode_video(as_json.content, max_pixels=10**6, max_frames=100, param="v")
    assert frames.shape == (6, 8, 16, 3)
    refused = http.post("/v1/videos/sync", json={**fields, "size": "100x100"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "size"


SYNC_EXTRA = ("num_frames", "seed", "fps", "num_inference_steps")


def stage_requests(http, model: str) -> float:
    lines = http.get("/metrics").text.splitlines()
    prefix = "omnistage_stage_requests{"
    values = [float(x.rsplit(" ", 1)[1]) for x in lines if x.startswith(prefix) and f'model="{model}"' in x]
    assert values, "no stage gauges for " + model
    return sum(values)


def test_video_list_delete_and_failure(client, http):
    jobs = [
        client.videos.create(
            model="toy-video",
            prompt=f"clip {i}",
            size="8x8",
            extra_body={"num_frames": 2, "num_inference_steps": 1},
        )
        for i in range(3)
    ]
    for job in jobs:
        wait_for(client, job.id)
    page = client.videos.list(limit=2, order="asc", after=jobs[0].id)
    assert [v.id for v in page.data] == [jobs[1].id, jobs[2].id]
    newest = http.get("/v1/videos", params={"limit": 1}).json()
    assert newest["data"][0]["id"] == jobs[2].id and newest["has_more"] is True

    deleted = client.videos.delete(jobs[0].id)
    assert deleted.deleted and deleted.id == jobs[0].id
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(jobs[0].id)

    long = client.videos.create(
        model="toy-video",
        prompt="long HOLD:never",  # held before its last step: running until deleted
        size="8x8",
        extra_body={"num_frames": 2, "num_inference_steps": 3},
    )
    wait_for(client, long.id, running_with_progress)
    assert stage_requests(http, "toy-video") == 1
    client.videos.delete(long.id)  # cancels the running job in every stage
    wait_until(lambda: stage_requests(http, "toy-video") == 0, what="toy-video stages idle")

    failing = client.videos.create(
        model="toy-video",
        prompt="FAIL please",
        size="8x8",
        extra_body={"num_frames": 2, "num_inference_steps": 1},
    )
    job, _ = wait_for(client, failing.id)
    assert job.status == "failed" and "asked to fail" in job.error.message
    response = http.get(f"/v1/videos/{failing.id}/content")
    assert response.status_code == 400 and response.json()["error"]["param"] == "video_id"


def test_video_request_errors(http):
    too_big = http.post("/v1/videos", data={"prompt": "x", "size": "100x100"})
    assert too_big.status_code == 400 and too_big.json()["error"]["param"] == "size"
    wrong = http.post("/v1/videos", json={"prompt": "x", "model": "toy-image"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "model"
    reference = http.post("/v1/videos", json={"prompt": "x", "input_reference": "https://example.com/a.png"})
    assert reference.status_code == 400 and "--allow-remote-media" in reference.json()["error"]["message"]
