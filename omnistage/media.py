"""Media encoding and decoding shared by engines, the server and clients: PNG/JPEG/WebP images, MP4 (H.264)
video through `av`, WAV audio through `soundfile`. No web framework here, so anything can reuse it.

Arrays follow the output conventions: images uint8 `[H, W, 3]`, video uint8 `[F, H, W, 3]`, audio float32
mono samples (or `[channels, samples]`).
"""

from __future__ import annotations

import base64
import io
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import torch
from PIL import Image

IMAGE_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}
PCM16_SCALE = 32767  # float samples in [-1, 1] ↔ 16-bit PCM
MIME_TYPES = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "jpg": "image/jpeg",
    "webp": "image/webp",
    "mp4": "video/mp4",
    "wav": "audio/wav",
}


def _numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def to_uint8(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Float pixels in [0, 1] → uint8, rounded the way diffusers' `numpy_to_pil` rounds."""
    t = torch.as_tensor(_numpy(x) if not isinstance(x, torch.Tensor) else x)
    if t.dtype == torch.uint8:
        return t
    return (t.float().clamp(0, 1) * 255).round().to(torch.uint8)


def encode_image(image: Any, fmt: str = "png", quality: int = 95) -> bytes:
    """One uint8 `[H, W, 3]` image (array, tensor or PIL) as PNG / JPEG / WebP bytes."""
    fmt = fmt.lower()
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"image format must be one of {sorted(set(IMAGE_FORMATS))}, got {fmt!r}")
    pil = image if isinstance(image, Image.Image) else Image.fromarray(_numpy(to_uint8(image)))
    buf = io.BytesIO()
    options = {} if IMAGE_FORMATS[fmt] == "PNG" else {"quality": quality}
    pil.convert("RGB").save(buf, format=IMAGE_FORMATS[fmt], **options)
    return buf.getvalue()


def decode_image(data: Any) -> Image.Image:
    """An input image from PIL, a uint8 HWC array/tensor, encoded bytes, or base64 text (data URL or bare)."""
    if isinstance(data, Image.Image):
        return data.convert("RGB")
    if isinstance(data, str):
        data = base64.b64decode(data.split(",", 1)[1] if data.startswith("data:") else data)
    if isinstance(data, bytes | bytearray | memoryview):
        return Image.open(io.BytesIO(bytes(data))).convert("RGB")
    array = _numpy(to_uint8(data) if isinstance(data, torch.Tensor) and data.is_floating_point() else data)
    if array.ndim != 3 or array.shape[-1] not in (1, 3, 4):
        raise ValueError(f"an image array must be [H, W, C] with C in 1, 3, 4; got shape {array.shape}")
    return Image.fromarray(
        array.astype(np.uint8).squeeze(-1) if array.shape[-1] == 1 else array.astype(np.uint8)
    )


def encode_video(
    frames: Any, fps: int, crf: int = 18, audio: Any = None, sample_rate: int | None = None
) -> bytes:
    """uint8 `[F, H, W, 3]` frames as H.264 MP4 at `fps` (odd sizes are edge-padded: yuv420p needs even),
    with `audio` (float samples, `[N]` mono or `[2, N]` stereo, at `sample_rate`) as its sound track where
    the clip has one. The track is FLAC, lossless: it decodes to the samples within 16-bit quantization."""
    array = _numpy(to_uint8(frames))
    if array.ndim != 4 or array.shape[-1] != 3:
        raise ValueError(f"video frames must be [F, H, W, 3], got shape {array.shape}")
    pad_h, pad_w = array.shape[1] % 2, array.shape[2] % 2
    if pad_h or pad_w:
        array = np.pad(array, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=int(fps))
        stream.width, stream.height = array.shape[2], array.shape[1]
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf)}
        if audio is not None:
            _mux_audio(container, audio, sample_rate)
        for frame in array:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def _mux_audio(container: Any, audio: Any, sample_rate: int | None) -> None:
    """Float samples → a 16-bit FLAC stream of `container` (samples beyond [-1, 1] are clipped)."""
    if not sample_rate:
        raise ValueError("a video's audio needs its sample_rate")
    samples = _numpy(audio).astype(np.float32)
    samples = samples[None] if samples.ndim == 1 else samples
    if samples.ndim != 2 or samples.shape[0] not in (1, 2):
        raise ValueError(f"video audio must be [N] mono or [2, N] stereo samples, got shape {samples.shape}")
    layout = "mono" if samples.shape[0] == 1 else "stereo"
    stream = container.add_stream("flac", rate=int(sample_rate))
    stream.layout, stream.format = layout, "s16"
    pcm = (np.clip(samples, -1.0, 1.0) * PCM16_SCALE).round().astype(np.int16)
    interleaved = np.ascontiguousarray(pcm.T).reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(interleaved, format="s16", layout=layout)
    frame.sample_rate, frame.pts, frame.time_base = int(sample_rate), 0, Fraction(1, int(sample_rate))
    for packet in [*stream.encode(frame), *stream.encode()]:  # the muxer needs the frame's timestamps
        container.mux(packet)


def decode_video(data: bytes) -> tuple[np.ndarray, float]:
    """MP4 (or any container `av` reads) → (uint8 `[F, H, W, 3]` frames, frames per second)."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
        fps = float(stream.average_rate) if stream.average_rate else 0.0
    return np.stack(frames), fps


def encode_audio(samples: Any, sample_rate: int, fmt: str = "wav") -> bytes:
    """float32 samples (`[N]` mono or `[C, N]`) as 16-bit PCM WAV."""
    if fmt.lower() != "wav":
        raise ValueError(f"audio format must be wav, got {fmt!r}")
    import soundfile

    array = _numpy(samples).astype(np.float32)
    if array.ndim == 2:
        array = array.T  # soundfile wants [N, C]
    buf = io.BytesIO()
    soundfile.write(buf, np.clip(array, -1.0, 1.0), int(sample_rate), format="WAV", subtype="PCM_16")
    return buf.getvalue()


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """WAV (or any format soundfile reads) → (float32 samples, `[N]` mono or `[C, N]`, sample rate)."""
    import soundfile

    array, rate = soundfile.read(io.BytesIO(data), dtype="float32")
    return (array.T if array.ndim == 2 else array), rate


def psnr(a: Any, b: Any, peak: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB between two arrays of the same shape (inf when equal)."""
    x, y = _numpy(a).astype(np.float64), _numpy(b).astype(np.float64)
    mse = float(np.mean((x - y) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(peak**2 / mse)


# ---- audio filters (FFmpeg through PyAV): the routes' and the stages' -----------------------------------
def _filter_audio(samples: np.ndarray, sample_rate: int, filters: list[tuple[str, str]]) -> np.ndarray:
    """Run FFmpeg audio filters (resampling, tempo) over mono float samples."""
    if samples.size == 0:
        return samples
    graph = av.filter.Graph()
    nodes = [
        graph.add_abuffer(
            format="flt", layout="mono", sample_rate=sample_rate, time_base=Fraction(1, sample_rate)
        )
    ]
    nodes += [graph.add(name, args) for name, args in filters]
    nodes.append(graph.add("abuffersink"))
    for src, dst in zip(nodes, nodes[1:], strict=False):
        src.link_to(dst)
    graph.configure()
    frame = av.AudioFrame.from_ndarray(samples[None, :].astype(np.float32), format="flt", layout="mono")
    frame.sample_rate, frame.pts, frame.time_base = sample_rate, 0, Fraction(1, sample_rate)
    graph.push(frame)
    graph.push(None)
    out = []
    while True:
        try:
            out.append(graph.pull().to_ndarray().reshape(-1))
        except (av.BlockingIOError, av.EOFError):
            break
    return np.concatenate(out).astype(np.float32) if out else samples[:0]


def resample(samples: np.ndarray, sample_rate: int, target_rate: int) -> np.ndarray:
    if target_rate == sample_rate:
        return samples
    return _filter_audio(samples, sample_rate, [("aresample", str(target_rate))])


def change_speed(samples: np.ndarray, sample_rate: int, speed: float) -> np.ndarray:
    """Tempo change that keeps the pitch (FFmpeg atempo takes factors in [0.5, 2], so chain them)."""
    if abs(speed - 1.0) < 1e-6:
        return samples
    factors = []
    while speed > 2.0:
        factors.append(2.0)
        speed /= 2.0
    while speed < 0.5:
        factors.append(0.5)
        speed /= 0.5
    factors.append(speed)
    return _filter_audio(samples, sample_rate, [("atempo", f"{f:.6f}") for f in factors])


def voice_samples(path: str | Path) -> tuple[np.ndarray, int]:
    """(samples, sample rate) of a voice file, what a stage that clones it reads: an uploaded voice in the
    server's store (safetensors), or an audio file (WAV, FLAC, ...) the offline API names."""
    if Path(path).suffix != ".safetensors":
        return decode_audio(Path(path).read_bytes())
    from safetensors import safe_open

    with safe_open(str(path), "np") as handle:
        return handle.get_tensor("audio"), int((handle.metadata() or {})["sample_rate"])
