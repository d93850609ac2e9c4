"""Dia's DAC codec stage: the reference's own output (greedy `generate`, CFG off) undelayed and decoded in one
pass equals `DiaProcessor.batch_decode`; async chunks, each decoded behind `context_frames` of left and
right context (DAC's convs are not causal), join into the one-pass waveform within 1e-4, alone and two
requests interleaved through the generation engine; one frame less of context is measurably off."""

from __future__ import annotations

import pytest
import torch

from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageSpec
from omnistage.families.dia.codec import DiaCodecGenerator, context_frames, create_engine, load_dac, undelay
from omnistage.families.dia.tiny import TINY, tiny_dia_dir
from omnistage.stages.base import EngineContext, StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.dia.reference import PROMPTS, reference_audio, reference_codes
from tests.support.codec_stream import stream

pytestmark = pytest.mark.engine

HOP = 32  # samples a frame (the tiny DAC's strides 4 x 4 x 2)
TOLERANCE = 1e-4
DELAY, EOS = TINY["delay_pattern"], TINY["decoder_config"]["eos_token_id"]


@pytest.fixture(scope="module")
def generator() -> DiaCodecGenerator:
    return DiaCodecGenerator(load_dac(tiny_dia_dir()), DELAY, {})


def random_codes(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 64, (frames, 4), generator=torch.Generator().manual_seed(seed))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


def engine(async_chunk: bool, **engine_args):  # noqa: ANN201
    deploy = StageDeploy(stage_id=1, async_chunk=async_chunk, engine_args=engine_args, max_num_seqs=8)
    stage = StageSpec(1, "codec", "generation", final_output=True, output_modality="audio")
    return create_engine(EngineContext(stage=stage, deploy=deploy, model_dir=str(tiny_dia_dir())))


def test_one_pass_equals_the_reference_batch_decode(generator) -> None:
    for text in PROMPTS[:3]:
        out = reference_codes(text)
        frames = undelay(out[1:], DELAY, EOS)  # the generated frames, as the decoder stage emits them
        end = int((out[:, 0] == EOS).nonzero()[0])
        assert frames.shape == (end - 1, 4)
        (got,) = generator.generate([frames], [None])
        want = reference_audio(out)
        assert got.shape == want.shape == ((end - 1) * HOP,)
        assert max_diff(got, want) <= 1e-6
    assert float(want.std()) > 0.01  # no silence, and the codes matter:
    (other,) = generator.generate([random_codes(frames.shape[0])], [None])
    assert max_diff(other, want) > 0.05


def test_undelay_as_frames_arrive() -> None:
    """Frame j needs delayed frames up to j + max(delay); none past channel 0's EOS."""
    delayed = random_codes(12)
    delayed[9, 0] = EOS
    for k in range(13):
        got = undelay(delayed[:k], DELAY, EOS)
        assert got.shape[0] == max(0, min(k - 4, 9))
        for j in range(got.shape[0]):
            assert got[j].tolist() == [int(delayed[j + d, c]) for c, d in enumerate(DELAY)]


def test_exact_context_is_the_receptive_field(generator) -> None:
    """`context_frames` is the decoder's receptive field, 18 frames each side for the tiny DAC: a chunk
    decoded behind it has the one-pass samples (float rounding apart); with 13 (the far frames' share
    decays: 17 still rounds alike, 14 is within 1e-4), it is off by more than 1e-4 on either side."""
    left, right = context_frames(generator.codec)
    assert (left, right) == (18, 18)
    codes = random_codes(100, seed=2)
    (want,) = generator.generate([codes], [None])
    a, b = 40, 50
    errors = {}
    for name, lo, hi in [
        ("exact", a - left, b + right),
        ("left 13", a - 13, b + right),
        ("right 13", a - left, b + 13),
    ]:
        (got,) = generator.generate([codes[lo:hi]], [None])
        errors[name] = max_diff(got[(a - lo) * HOP : (b - lo) * HOP], want[a * HOP : b * HOP])
    assert errors["exact"] <= 1e-6 and min(errors["left 13"], errors["right 13"]) > TOLERANCE, errors


def test_the_engine_decodes_async_chunks_into_the_one_pass_waveform(generator) -> None:
    eng = engine(async_chunk=True, chunk_frames=8, first_chunk_frames=2)
    assert (eng.left_context, eng.right_context) == (18, 18) and not eng.streams
    codes = [random_codes(40, seed=5), random_codes(120, seed=6)]
    got = stream(eng, codes, piece=3)
    for i, c in enumerate(codes):
        (want,) = generator.generate([c], [None])
        assert max_diff(got[f"r{i}"], want) <= TOLERANCE
    assert eng.passes > 10


def test_full_handoff_decodes_in_one_pass(generator) -> None:
    eng = engine(async_chunk=False)
    codes = random_codes(40, seed=7)
    eng.add_request(StageRequest("r", inputs=GenerationInputs(codes)))
    (out,) = eng.step()
    (want,) = generator.generate([codes], [None])
    assert out.finished and out.sample_rate == 44100
    assert max_diff(out.audio, want) <= 1e-6
