"""Media the server needs beyond the shared codecs in `omnistage.media` (images, MP4): every audio format
clients ask for (WAV/PCM/FLAC/MP3/Opus, resampling, tempo, open-ended WAV streams) and decoders of
uploads that enforce the server's limits, because a small upload can decode to a huge array.

soundfile (libsndfile) and PyAV (FFmpeg) do the work, so no torchvision/torchaudio is needed.
"""

from __future__ import annotations

import base64
import io
import struct
from typing import Any

import av
import numpy as np
import soundfile as sf
from PIL import Image

from omnistage.errors import InvalidRequestError
from omnistage.media import resample

AUDIO_CONTENT_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
    "aac": "audio/aac",
}
# libsndfile containers and the sample rates their codecs accept (None: any).
_SOUNDFILE_FORMATS = {
    "wav": ("WAV", "PCM_16", None),
    "flac": ("FLAC", "PCM_16", None),
    "mp3": ("MP3", "MPEG_LAYER_III", (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)),
    "opus": ("OGG", "OPUS", (8000, 12000, 16000, 24000, 48000)),
}


# ---- audio out -------------------------------------------------------------------------------------
def as_mono_float32(audio: Any) -> np.ndarray:
    """Samples from a torch tensor or array, averaged to one channel if the engine gave several."""
    if hasattr(audio, "detach"):
        audio = audio.detach().to("cpu").float().numpy()
    samples = np.asarray(audio, dtype=np.float32)
    if samples.ndim > 1:  # [channels, n] or [n, channels]: mix down
        channels_last = samples.shape[-1] <= 2 < samples.shape[0]
        samples = (
            samples.mean(axis=-1) if channels_last else samples.reshape(-1, samples.shape[-1]).mean(axis=0)
        )
    samples = np.nan_to_num(samples)  # a copy: the engine's tensor is left as it was
    return np.clip(samples, -1.0, 1.0, out=samples)


def pcm16(samples: np.ndarray) -> bytes:
    """Signed 16-bit little-endian PCM, what `pcm` responses and WAV bodies carry."""
    scaled = np.clip(samples, -1.0, 1.0) * 32767.0
    return np.rint(scaled, out=scaled).astype("<i2").tobytes()


def wav_header(sample_rate: int, num_samples: int | None = None) -> bytes:
    """A 16-bit mono WAV header; `num_samples=None` marks an open-ended stream (sizes 0xFFFFFFFF)."""
    data_size = 0xFFFFFFFF if num_samples is None else num_samples * 2
    riff_size = 0xFFFFFFFF if num_samples is None else 36 + data_size
    return (
        b"RIFF"
        + struct.pack("<I", riff_size)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_size)
    )


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    return wav_header(sample_rate, len(samples)) + pcm16(samples)


def encode_audio(samples: np.ndarray, sample_rate: int, fmt: str) -> tuple[bytes, int]:
    """(encoded bytes, the sample rate actually used): codecs with fixed rates get resampled to 48 kHz."""
    if fmt == "pcm":
        return pcm16(samples), sample_rate
    if fmt == "wav":
        return wav_bytes(samples, sample_rate), sample_rate
    if fmt == "aac":
        return _aac(samples, sample_rate), sample_rate
    container, subtype, rates = _SOUNDFILE_FORMATS[fmt]
    if rates is not None and sample_rate not in rates:
        samples, sample_rate = resample(samples, sample_rate, 48000), 48000
    buf = io.BytesIO()
    # Quantize once, our way, so every format carries the same 16-bit samples as `pcm` and `wav`.
    sf.write(buf, np.frombuffer(pcm16(samples), "<i2"), sample_rate, format=container, subtype=subtype)
    return buf.getvalue(), sample_rate


def _aac(samples: np.ndarray, sample_rate: int) -> bytes:
    """AAC in an ADTS stream (what `audio/aac` means), encoded by FFmpeg through PyAV from the same 16-bit
    samples as every other format."""
    quantized = np.frombuffer(pcm16(samples), "<i2").astype(np.float32) / 32767.0
    buf = io.BytesIO()
    with av.open(buf, "w", format="adts") as container:
        stream = container.add_stream("aac", rate=sample_rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(quantized[None, :], format="fltp", layout="mono")
        frame.sample_rate = sample_rate
        for packet in (*stream.encode(frame), *stream.encode(None)):
            container.mux(packet)
    return buf.getvalue()


# ---- arrays and data URLs ------------------------------------------------------------------------
def as_uint8_hwc(image: Any) -> np.ndarray:
    """An image as uint8 [H, W, 3] from a PIL image, an array or a tensor (uint8, or float in [0, 1])."""
    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"))
    if hasattr(image, "detach"):
        image = image.detach().to("cpu").numpy()
    array = np.asarray(image)
    if array.dtype != np.uint8:
        array = (np.clip(np.nan_to_num(array.astype(np.float32)), 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if array.ndim == 2:
        array = np.repeat(array[..., None], 3, axis=-1)
    if array.shape[-1] == 4:
        array = array[..., :3]
    return np.ascontiguousarray(array)


def data_url(content_type: str, data: bytes) -> str:
    return f"data:{content_type};base64,{base64.b64encode(data).decode()}"


# ---- media in --------------------------------------------------------------------------------------
def decode_image(data: bytes, *, max_pixels: int, param: str) -> Image.Image:
    """An uploaded image as RGB, refusing undecodable data and sizes over the server's pixel limit."""
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > max_pixels:
            raise InvalidRequestError(
                f"{param}: image of {width}x{height} exceeds the maximum of {max_pixels} pixels", param=param
            )
        return image.convert("RGB")
    except InvalidRequestError:
        raise
    except Exception as exc:  # PIL raises many types for bad data
        raise InvalidRequestError(
            f"{param}: not a decodable image ({type(exc).__name__})", param=param
        ) from exc


def decode_audio(data: bytes, *, param: str) -> tuple[np.ndarray, int]:
    """(mono float32 samples, sample rate) from WAV/FLAC/MP3/OGG (libsndfile) or anything FFmpeg reads."""
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
        return samples.mean(axis=1), int(rate)
    except Exception:
        pass
    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=stream.rate)
            chunks = [
                f.to_ndarray().reshape(-1) for fr in container.decode(stream) for f in resampler.resample(fr)
            ]
            return np.concatenate(chunks).astype(np.float32), int(stream.rate)
    except Exception as exc:
        raise InvalidRequestError(
            f"{param}: not a decodable audio file ({type(exc).__name__})", param=param
        ) from exc


def decode_video(data: bytes, *, max_pixels: int, max_frames: int, param: str) -> np.ndarray:
    """uint8 [F, H, W, 3] frames of a video upload, at most `max_frames` evenly spaced ones."""
    try:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            if stream.width * stream.height > max_pixels:
                raise InvalidRequestError(
                    f"{param}: video of {stream.width}x{stream.height} is over the limit of {max_pixels} px",
                    param=param,
                )
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    except InvalidRequestError:
        raise
    except Exception as exc:
        raise InvalidRequestError(
            f"{param}: not a decodable video ({type(exc).__name__})", param=param
        ) from exc
    if not frames:
        raise InvalidRequestError(f"{param}: the video has no frames", param=param)
    if len(frames) > max_frames:
        keep = np.linspace(0, len(frames) - 1, max_frames).round().astype(int)
        frames = [frames[i] for i in keep]
    return np.stack(frames)
