"""Media encoding and decoding: every format round-trips through an independent decoder."""

import io

import av
import numpy as np
import pytest
import soundfile as sf

from omnistage.errors import InvalidRequestError
from omnistage.media import change_speed, encode_image, encode_video, resample
from omnistage.serving import media

pytestmark = pytest.mark.unit
RATE = 24000


def tone(seconds: float = 0.5, rate: int = RATE, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def dominant_frequency(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[spectrum.argmax()])


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "opus"])
def test_audio_formats_decode_back_to_the_same_tone(fmt):
    samples = tone()
    data, rate = media.encode_audio(samples, RATE, fmt)
    decoded, decoded_rate = sf.read(io.BytesIO(data), dtype="float32")
    assert decoded_rate == rate == RATE
    assert abs(len(decoded) - len(samples)) < 0.05 * RATE  # codecs may pad a frame
    assert abs(dominant_frequency(decoded, rate) - 440.0) < 5.0
    if fmt in ("wav", "flac"):  # lossless 16-bit
        np.testing.assert_allclose(decoded, samples, atol=1 / 32767 + 1e-6)


def test_pcm_is_s16le_and_wav_header_matches_soundfile():
    samples = tone(0.1)
    pcm, _ = media.encode_audio(samples, RATE, "pcm")
    assert len(pcm) == 2 * len(samples)
    np.testing.assert_array_equal(np.frombuffer(pcm, "<i2"), (samples * 32767).round().astype("<i2"))
    wav = media.wav_bytes(samples, RATE)
    decoded, rate = sf.read(io.BytesIO(wav), dtype="int16")
    assert rate == RATE and np.array_equal(decoded, np.frombuffer(pcm, "<i2"))


def test_streaming_wav_header_plus_chunks_is_readable():
    chunks = [tone(0.1), tone(0.1)]
    stream = media.wav_header(RATE) + b"".join(media.pcm16(c) for c in chunks)
    with av.open(io.BytesIO(stream)) as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
    assert sum(len(f) for f in frames) == sum(len(c) for c in chunks)


def test_opus_at_an_unsupported_rate_is_resampled_to_48k():
    _, rate = media.encode_audio(tone(rate=22050), 22050, "opus")
    assert rate == 48000


def test_resample_and_speed_keep_pitch_and_change_length():
    samples = tone(1.0)
    up = resample(samples, RATE, 48000)
    assert abs(len(up) - 48000) <= 64
    assert abs(dominant_frequency(up, 48000) - 440.0) < 3.0
    fast = change_speed(samples, RATE, 2.0)
    assert abs(len(fast) - RATE // 2) < 0.05 * RATE
    assert abs(dominant_frequency(fast, RATE) - 440.0) < 10.0  # tempo changes, pitch does not
    slow = change_speed(samples, RATE, 0.25)  # below atempo's 0.5 floor: chained
    assert abs(len(slow) - 4 * RATE) < 0.1 * RATE


def test_mono_mixdown_from_channels_first_or_last():
    stereo = np.stack([tone(0.1), -tone(0.1)])
    assert media.as_mono_float32(stereo).shape == (2400,)
    assert np.allclose(media.as_mono_float32(stereo), 0.0)
    assert media.as_mono_float32(stereo.T).shape == (2400,)


def test_decode_video_reads_frames_of_an_odd_sized_mp4():
    video = np.zeros((5, 15, 21, 3), dtype=np.uint8)
    video[:, :, :, 0] = np.arange(5)[:, None, None] * 50  # red ramps over time
    decoded = media.decode_video(encode_video(video, fps=8), max_pixels=10**6, max_frames=100, param="v")
    assert decoded.shape == (5, 16, 22, 3)  # the shared encoder pads to even sizes for 4:2:0
    red = decoded[:, :15, :21, 0].astype(float).mean(axis=(1, 2))
    np.testing.assert_allclose(red, np.arange(5) * 50, atol=6)


def test_decode_video_subsamples_to_max_frames():
    data = encode_video(np.zeros((10, 8, 8, 3), dtype=np.uint8), fps=4)
    assert media.decode_video(data, max_pixels=10**6, max_frames=3, param="v").shape[0] == 3


def test_decoders_name_the_field_on_bad_or_oversized_input():
    with pytest.raises(InvalidRequestError) as info:
        media.decode_image(b"not an image", max_pixels=100, param="image")
    assert info.value.param == "image" and "decodable" in info.value.message
    big = encode_image(np.zeros((20, 20, 3), dtype=np.uint8))
    with pytest.raises(InvalidRequestError, match="exceeds the maximum of 100 pixels"):
        media.decode_image(big, max_pixels=100, param="image")
    with pytest.raises(InvalidRequestError) as info:
        media.decode_audio(b"\x00garbage" * 10, param="messages[0].content[1].input_audio.data")
    assert info.value.param == "messages[0].content[1].input_audio.data"


def test_decode_audio_reads_mp3_and_returns_mono():
    stereo = np.stack([tone(0.3), tone(0.3)], axis=1)
    buf = io.BytesIO()
    sf.write(buf, stereo, RATE, format="MP3")
    samples, rate = media.decode_audio(buf.getvalue(), param="a")
    assert rate == RATE and samples.ndim == 1
    assert abs(dominant_frequency(samples, rate) - 440.0) < 5.0


def test_aac_is_an_adts_stream_of_the_same_tone():
    samples = tone()
    data, rate = media.encode_audio(samples, RATE, "aac")
    assert rate == RATE and data[:2] in (b"\xff\xf1", b"\xff\xf9")  # an ADTS sync word
    with av.open(io.BytesIO(data), format="adts") as container:
        assert container.streams.audio[0].codec_context.name == "aac"
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert abs(len(decoded) - len(samples)) < 0.1 * RATE  # AAC pads its priming and last frame
    assert abs(dominant_frequency(decoded, rate) - 440.0) < 5.0
