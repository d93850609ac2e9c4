"""CSM's Mimi codec stage: a one-pass decode equals `codec_model.decode` of the checkpoint loaded by
transformers; a request's frames decoded as a stream, chunk by chunk, each once, join into the one-pass
waveform (float32 rounding apart), alone, interleaved with another stream and through the generation engine;
a chunk decoded in one pass behind `context_frames` of left context has the one-pass samples too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import CsmForConditionalGeneration

from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageSpec
from omnistage.families.csm.codec import (
    CsmCodecGenerator,
    context_frames,
    create_engine,
    load_mimi,
)
from omnistage.families.csm.tiny import tiny_csm_dir
from omnistage.stages.base import EngineContext, StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.support.codec_stream import stream

pytestmark = pytest.mark.engine

FRAME = 1920  # samples a frame at 24 kHz (12.5 Hz)
TOLERANCE = 1e-4  # streamed vs one pass, float32 (measured: 1.2e-6 on a waveform of std 0.17, max 1.0)


@pytest.fixture(scope="module")
def codec_dir() -> Path:
    """The tiny CSM checkpoint (its codec's transformer made to count: tiny.py `_audible_codec`)."""
    return tiny_csm_dir()


@pytest.fixture(scope="module")
def reference(codec_dir: Path):
    return CsmForConditionalGeneration.from_pretrained(str(codec_dir)).codec_model.eval()


@pytest.fixture(scope="module")
def generator(codec_dir: Path) -> CsmCodecGenerator:
    return CsmCodecGenerator(load_mimi(codec_dir))


def random_codes(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (frames, 8), generator=torch.Generator().manual_seed(seed))


def reference_decode(reference, codes: torch.Tensor) -> torch.Tensor:
    """As `generate(..., output_audio=True)` decodes a request's [T, K] codes."""
    with torch.inference_mode():
        return reference.decode(codes.transpose(0, 1).unsqueeze(0)).audio_values[0, 0]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


def test_one_pass_equals_the_reference_decode(generator, reference) -> None:
    codes = random_codes(40)
    want = reference_decode(reference, codes)
    (got,) = generator.generate([codes], [None])
    assert got.dtype == torch.float32 and got.shape == (40 * FRAME,)
    assert max_diff(got, want) <= 1e-6
    assert generator.codec.encoder is None  # the decoder only
    assert (generator.sample_rate, generator.outputs_per_frame) == (24000, FRAME)
    assert float(want.std()) > 0.05  # no silence, and the codes matter:
    assert max_diff(want, reference_decode(reference, random_codes(40, seed=1))) > 0.1


def test_streamed_chunks_join_into_the_one_pass_waveform(generator) -> None:
    codes = random_codes(40)
    (want,) = generator.generate([codes], [None])
    pieces, start = [], 0
    for n in (2, 4, 8, 13, 13):
        (piece,) = generator.generate([codes[start : start + n]], [None], ["s"])
        assert piece.shape == (n * FRAME,)
        pieces.append(piece)
        start += n
    assert max_diff(torch.cat(pieces), want) <= TOLERANCE
    generator.end_stream("s")


def test_a_stream_past_the_sliding_window_keeps_its_positions(generator) -> None:
    """300 frames: 600 transformer steps, past its 250-step window, so the cache drops keys; a stream that
    restarted its positions each chunk would be 0.01 off."""
    codes = random_codes(300, seed=2)
    (want,) = generator.generate([codes], [None])
    pieces = [generator.generate([codes[i : i + 23]], [None], ["long"])[0] for i in range(0, 300, 23)]
    assert max_diff(torch.cat(pieces), want) <= TOLERANCE
    stream = generator.streams.pop("long")
    assert stream.cache.get_seq_length() == 600
    assert stream.cache.layers[0].keys.shape[2] == 249  # the window's earlier keys only
    assert max(past.shape[-1] for past in stream.inputs.values()) == 6  # the convs': kernel 7 at most


def test_interleaved_streams_stay_apart_and_an_ended_stream_starts_afresh(generator) -> None:
    codes = {"a": random_codes(40, seed=3), "b": random_codes(40, seed=4)}
    want = {sid: generator.generate([c], [None])[0] for sid, c in codes.items()}
    got: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    calls = [[("a", 0, 5), ("b", 0, 2)], [("b", 2, 9)], [("a", 5, 20), ("b", 11, 29)], [("a", 25, 15)]]
    for call in calls:  # (stream, first frame, frames) per window
        windows = [codes[sid][start : start + n] for sid, start, n in call]
        pieces = generator.generate(windows, [None] * len(call), [sid for sid, _, _ in call])
        for (sid, _, n), piece in zip(call, pieces, strict=True):
            assert piece.shape == (n * FRAME,)
            got[sid].append(piece)
    for sid in codes:
        assert max_diff(torch.cat(got[sid]), want[sid]) <= TOLERANCE
    generator.end_stream("a")
    generator.end_stream("a")  # ending it twice is harmless
    (again,) = generator.generate([codes["b"][:9]], [None], ["a"])  # the id reused: a new stream
    assert max_diff(again, want["b"][: 9 * FRAME]) <= TOLERANCE
    generator.end_stream("a"), generator.end_stream("b")
    assert generator.streams == {}


def test_empty_windows_give_empty_audio(generator) -> None:
    empty = torch.empty(0, 8, dtype=torch.long)
    assert [w.numel() for w in generator.generate([empty], [None])] == [0]
    assert [w.numel() for w in generator.generate([empty], [None], ["e"])] == [0]
    assert generator.streams == {}


def test_load_is_strict_about_the_codec_weights(codec_dir: Path, tmp_path: Path) -> None:
    """A checkpoint missing one decoder weight does not load (it would decode with random weights)."""
    with safe_open(str(codec_dir / "model.safetensors"), "pt") as f:
        keys = [k for k in f.keys() if k.startswith("codec_model.")]  # noqa: SIM118 - not iterable
        tensors = {
            k: f.get_tensor(k) for k in keys if k != "codec_model.decoder_transformer.layers.1.mlp.fc2.weight"
        }
    shutil.copy(codec_dir / "config.json", tmp_path / "config.json")
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="fc2"):
        load_mimi(tmp_path)


def engine(codec_dir: Path, async_chunk: bool, dtype: str = "auto", **engine_args):  # noqa: ANN201
    deploy = StageDeploy(
        stage_id=1, async_chunk=async_chunk, engine_args=engine_args, max_num_seqs=8, dtype=dtype
    )
    stage = StageSpec(1, "codec", "generation", final_output=True, output_modality="audio")
    return create_engine(EngineContext(stage=stage, deploy=deploy, model_dir=str(codec_dir)))


def test_the_engine_streams_async_chunks_into_the_one_pass_waveform(codec_dir: Path, reference) -> None:
    eng = engine(codec_dir, async_chunk=True, chunk_frames=8, first_chunk_frames=2)
    assert eng.streams and eng.left_context == 0
    assert next(eng.generator.codec.parameters()).dtype == torch.float32  # "auto": the checkpoint's
    codes = [random_codes(40, seed=5), random_codes(300, seed=6)]
    got = stream(eng, codes, piece=3)
    for i, c in enumerate(codes):
        assert max_diff(got[f"r{i}"], reference_decode(reference, c)) <= TOLERANCE
    assert eng.generator.streams == {}


def test_a_bf16_deployment_streams_in_bf16_close_to_the_reference(codec_dir: Path, reference) -> None:
    """`dtype: bfloat16` runs the codec in bf16 ("auto": the checkpoint's float32); its rounding moves the
    waveform, so a correlation bound, not equality."""
    eng = engine(codec_dir, async_chunk=True, dtype="bfloat16", chunk_frames=8, first_chunk_frames=2)
    assert next(eng.generator.codec.parameters()).dtype == torch.bfloat16
    codes = random_codes(40, seed=5)
    wave, want = stream(eng, [codes], piece=3)["r0"], reference_decode(reference, codes)
    assert wave.dtype == torch.float32 and wave.shape == want.shape
    assert float(torch.corrcoef(torch.stack([wave, want]))[0, 1]) >= 0.99


def test_full_handoff_decodes_in_one_pass_as_the_reference(codec_dir: Path, reference) -> None:
    eng = engine(codec_dir, async_chunk=False)
    codes = random_codes(40, seed=7)
    eng.add_request(StageRequest("r", inputs=GenerationInputs(codes)))
    (out,) = eng.step()
    assert out.finished and out.sample_rate == 24000
    assert max_diff(out.audio, reference_decode(reference, codes)) <= 1e-6


def test_chunks_behind_the_receptive_field_have_the_one_pass_samples(codec_dir: Path, generator) -> None:
    """`left_context_frames: "exact"` is `context_frames`, 254 frames for the tiny codec: its transformer's 2
    layers x 249 steps (2 a frame) and its convs' few. A chunk decoded in one pass behind that many frames
    has the one-pass decode's samples; behind 100, it is measurably off."""
    eng = engine(codec_dir, async_chunk=True, left_context_frames="exact")
    assert eng.left_context == context_frames(eng.generator.codec) == 254 and not eng.streams
    codes = random_codes(300, seed=2)
    (want,) = generator.generate([codes], [None])
    start = 280
    errors = {}
    for context in (254, 100):
        (got,) = generator.generate([codes[start - context :]], [None])
        errors[context] = max_diff(got[context * FRAME :], want[start * FRAME :])
    assert errors[254] <= TOLERANCE < errors[100], errors
