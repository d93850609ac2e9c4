"""Media encoding: PNG/JPEG/WebP, H.264 MP4 at the requested fps, WAV."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from omnistage import media

pytestmark = pytest.mark.unit


def gradient(h: int = 32, w: int = 48) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], -1).astype(np.uint8)


def test_to_uint8_rounds_like_diffusers():
    x = torch.tensor([0.0, 0.6 / 255, 0.4, 1.0, 1.7, -0.2])
    assert media.to_uint8(x).tolist() == [0, 1, 102, 255, 255, 0]


@pytest.mark.parametrize(("fmt", "lossless"), [("png", True), ("jpeg", False), ("webp", False)])
def test_images_roundtrip(fmt, lossless):
    image = gradient()
    data = media.encode_image(torch.from_numpy(image), fmt)
    decoded = np.asarray(Image.open(io.BytesIO(data)))
    assert decoded.shape == image.shape
    diff = np.abs(decoded.astype(int) - image.astype(int))
    assert diff.max() == 0 if lossless else diff.mean() < 8
    assert np.array_equal(np.asarray(media.decode_image(data)), decoded)


def test_float_image_tensor_and_bad_format():
    data = media.encode_image(torch.full((8, 8, 3), 0.5), "png")
    assert np.asarray(media.decode_image(data))[0, 0, 0] == 128
    with pytest.raises(ValueError, match="image format"):
        media.encode_image(gradient(), "bmp")


def test_mp4_h264_roundtrip_keeps_frames_and_fps():
    frames = np.stack([np.roll(gradient(32, 48), 4 * i, axis=1) for i in range(9)])
    data = media.encode_video(frames, fps=8)
    import av

    with av.open(io.BytesIO(data)) as container:
        assert container.streams.video[0].codec_context.name == "h264"
    decoded, fps = media.decode_video(data)
    assert decoded.shape == frames.shape and fps == 8
    assert media.psnr(decoded / 255.0, frames / 255.0) > 30


def test_mp4_pads_odd_sizes():
    decoded, _ = media.decode_video(media.encode_video(np.zeros((2, 15, 17, 3), np.uint8), fps=4))
    assert decoded.shape == (2, 16, 18, 3)


def test_wav_roundtrip():
    rate = 16000
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(rate // 10) / rate)).astype(np.float32)
    samples, got_rate = media.decode_audio(media.encode_audio(tone, rate))
    assert got_rate == rate and samples.shape == tone.shape
    assert np.abs(samples - tone).max() < 1e-3
    stereo, _ = media.decode_audio(media.encode_audio(np.stack([tone, -tone]), rate))
    assert stereo.shape == (2, tone.shape[0])


def test_psnr():
    a = np.zeros((4, 4))
    assert media.psnr(a, a) == float("inf")
    assert abs(media.psnr(a, a + 0.1) - 20.0) < 1e-9


@pytest.mark.parametrize("channels", [1, 2])
def test_mp4_carries_a_sound_track_that_decodes_to_the_samples(channels):
    """The track is FLAC in the MP4: it decodes to the float samples within 16-bit quantization."""
    import av

    samples = np.random.RandomState(channels).uniform(-0.9, 0.9, (channels, 3200)).astype(np.float32)
    audio = samples[0] if channels == 1 else samples
    data = media.encode_video(gradient()[None].repeat(5, 0), fps=25, audio=audio, sample_rate=16000)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        assert (stream.codec_context.name, stream.sample_rate) == ("flac", 16000)
        pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])
    decoded = pcm.reshape(-1, channels).T / media.PCM16_SCALE
    assert decoded.shape == samples.shape
    assert np.abs(decoded - samples).max() <= 0.5 / media.PCM16_SCALE + 1e-7
    assert media.decode_video(data)[0].shape == (5, 32, 48, 3)
    with pytest.raises(ValueError, match="sample_rate"):
        media.encode_video(gradient()[None], fps=25, audio=audio)
