"""Images, video jobs and audio from real tiny diffusers checkpoints (FLUX.1, Wan2.1, Stable Audio) on the
diffusion engine.

Equality with plain diffusers is the diffusion engine's own test; here: the server's paths over it."""

import base64
import io

import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from omnistage.serving import media
from tests.support.polling import wait_until

pytestmark = pytest.mark.e2e


def decode_png(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


def test_flux_images_are_seeded_and_chat_agrees(client):
    params = {"seed": 4, "num_inference_steps": 2}
    reply = client.images.generate(model="tiny-flux1", prompt="a lighthouse", size="32x32", extra_body=params)
    got = decode_png(reply.data[0].b64_json)
    assert got.shape == (32, 32, 3) and got.std() > 0
    chat = client.chat.completions.create(
        model="tiny-flux1",
        messages=[{"role": "user", "content": "a lighthouse"}],
        extra_body={"size": "32x32", **params},
    )
    url = chat.choices[0].message.content[0]["image_url"]["url"]
    assert np.array_equal(decode_png(url.split(",", 1)[1]), got)  # same request through chat: same image
    other = client.images.generate(
        model="tiny-flux1", prompt="a lighthouse", size="32x32", extra_body={**params, "seed": 5}
    )
    assert not np.array_equal(decode_png(other.data[0].b64_json), got)


def test_wan_video_job_reports_engine_progress_and_serves_the_frames(client):
    body = {"num_frames": 5, "num_inference_steps": 4, "seed": 3, "fps": 8}
    job = client.videos.create(model="tiny-wan21-t2v", prompt="waves", size="32x32", extra_body=body)
    seen = []

    def ended():
        current = client.videos.retrieve(job.id)
        seen.append(current.progress)
        return current if current.status in ("completed", "failed") else None

    job = wait_until(ended, what="the wan video job ended")
    assert job.status == "completed", job.error
    assert seen == sorted(seen) and seen[-1] == 100
    assert job.size == "32x32" and float(job.seconds) == 5 / 8
    mp4 = client.videos.download_content(job.id).content
    frames = media.decode_video(mp4, max_pixels=10**6, max_frames=99, param="v")
    assert frames.shape == (5, 32, 32, 3)


def test_stable_audio_through_the_speech_route(client):
    def speak(seed: int) -> bytes:
        return client.audio.speech.create(
            model="tiny-stable-audio",
            input="rain on a roof",
            voice="none",
            response_format="wav",
            extra_body={"seed": seed},
        ).content

    first, again, other = speak(1), speak(1), speak(2)
    samples, rate = sf.read(io.BytesIO(first), dtype="float32")
    assert rate == 16000 and len(samples) > 0 and np.abs(samples).max() > 0
    assert first == again and first != other


def test_model_specific_knobs_are_declared_and_refused_where_absent(client, http):
    """/v1/models lists each model's own diffusion knobs; one it lacks is a 400 naming it, before any work."""
    models = {m["id"]: m["omnistage"] for m in http.get("/v1/models").json()["data"]}
    assert models["tiny-wan21-t2v"]["diffusion_options"] == ["flow_shift"]
    assert models["tiny-flux1"]["diffusion_options"] == []
    body = {"model": "tiny-wan21-t2v", "prompt": "waves", "size": "32x32", "num_frames": 5}
    shifted = http.post(
        "/v1/videos/sync", json={**body, "num_inference_steps": 2, "seed": 1, "flow_shift": 5.0}
    )
    plain = http.post("/v1/videos/sync", json={**body, "num_inference_steps": 2, "seed": 1})
    assert shifted.status_code == plain.status_code == 200 and shifted.content != plain.content
    refused = http.post("/v1/videos", json={**body, "boundary_ratio": 0.5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "boundary_ratio"
    image = http.post(
        "/v1/images/generations",
        json={"model": "tiny-flux1", "prompt": "a cat", "size": "32x32", "flow_shift": 3},
    )
    assert image.status_code == 400 and image.json()["error"]["param"] == "flow_shift"
    out_of_range = http.post("/v1/videos", json={**body, "flow_shift": -1})
    assert out_of_range.status_code == 400 and out_of_range.json()["error"]["param"] == "flow_shift"
