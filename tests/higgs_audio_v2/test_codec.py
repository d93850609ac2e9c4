"""Higgs Audio v2's codec stage: a one-pass decode equals `HiggsAudioV2TokenizerModel.decode` (the processor's
`audio_tokenizer`) of the checkpoint loaded by transformers; the decoder is not causal, so async chunks are
each decoded behind and ahead of the receptive field (`context_frames`, measured: 10 frames each way for the
tiny codec, and one frame less is not exact) and join into the one-pass waveform, alone and interleaved,
through the generation engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoProcessor

from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageSpec
from omnistage.families.higgs_audio_v2.codec import (
    HiggsCodecGenerator,
    context_frames,
    create_engine,
    load_codec,
)
from omnistage.families.higgs_audio_v2.tiny import tiny_higgs_dir
from omnistage.stages.base import EngineContext, StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.support.codec_stream import stream

pytestmark = pytest.mark.engine

FRAME = 960  # samples a frame at 24 kHz (25 Hz)
TOLERANCE = 1e-4  # chunked vs one pass, float32
K = 5  # the tiny codec's codebooks


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny_higgs_dir()


@pytest.fixture(scope="module")
def reference(model_dir: Path):
    return AutoProcessor.from_pretrained(str(model_dir)).audio_tokenizer.eval()


@pytest.fixture(scope="module")
def generator(model_dir: Path) -> HiggsCodecGenerator:
    return HiggsCodecGenerator(load_codec(model_dir))


def random_codes(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (frames, K), generator=torch.Generator().manual_seed(seed))


def reference_decode(reference, codes: torch.Tensor) -> torch.Tensor:
    """As `processor.decode` decodes a request's reverted [T, K] codes."""
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
    assert (generator.sample_rate, generator.outputs_per_frame) == (24000, FRAME)
    assert float(want.std()) > 0.05  # no silence, and the codes matter:
    assert max_diff(want, reference_decode(reference, random_codes(40, seed=1))) > 0.1


def test_context_frames_is_the_smallest_exact_context(generator) -> None:
    left, right = context_frames(generator.codec)
    assert (left, right) == (10, 10)
    codes = random_codes(60, seed=2)
    (want,) = generator.generate([codes], [None])
    start, end = 25, 34

    def chunk(back: int, ahead: int) -> torch.Tensor:
        lo, hi = start - back, end + ahead
        (wave,) = generator.generate([codes[lo:hi]], [None])
        return wave[(start - lo) * FRAME : (end - lo) * FRAME]

    exact = max_diff(chunk(left, right), want[start * FRAME : end * FRAME])
    assert exact <= TOLERANCE
    # a frame less either way moves samples past float rounding
    assert max_diff(chunk(left - 1, right), want[start * FRAME : end * FRAME]) > 20 * exact
    assert max_diff(chunk(left, right - 1), want[start * FRAME : end * FRAME]) > 20 * exact


def test_empty_windows_give_empty_audio(generator) -> None:
    empty = torch.empty(0, K, dtype=torch.long)
    assert [w.numel() for w in generator.generate([empty], [None])] == [0]


def engine(model_dir: Path, async_chunk: bool, **engine_args):  # noqa: ANN201
    deploy = StageDeploy(stage_id=1, async_chunk=async_chunk, engine_args=engine_args, max_num_seqs=8)
    stage = StageSpec(1, "codec", "generation", final_output=True, output_modality="audio")
    return create_engine(EngineContext(stage=stage, deploy=deploy, model_dir=str(model_dir)))


def test_the_engine_joins_async_chunks_into_the_one_pass_waveform(model_dir: Path, reference) -> None:
    eng = engine(model_dir, async_chunk=True, chunk_frames=8, first_chunk_frames=2)
    assert not eng.streams and (eng.left_context, eng.right_context) == (10, 10)
    codes = [random_codes(40, seed=5), random_codes(90, seed=6), random_codes(3, seed=7)]
    got = stream(eng, codes, piece=3)
    for i, c in enumerate(codes):
        assert max_diff(got[f"r{i}"], reference_decode(reference, c)) <= TOLERANCE, i


def test_a_stream_left_context_is_refused(model_dir: Path) -> None:
    with pytest.raises(ValueError, match="causal"):
        engine(model_dir, async_chunk=True, left_context_frames="stream")


def test_full_handoff_decodes_in_one_pass_as_the_reference(model_dir: Path, reference) -> None:
    eng = engine(model_dir, async_chunk=False)
    codes = random_codes(40, seed=7)
    eng.add_request(StageRequest("r", inputs=GenerationInputs(codes)))
    outs = []
    while eng.has_work():
        outs += eng.step()
    assert len(outs) == 1 and outs[0].finished
    assert max_diff(outs[0].audio, reference_decode(reference, codes)) <= 1e-6
