"""Qwen3-Omni's code2wav stage decoding async chunks as streams (the default): each chunk decoded once,
continuing its request's layer states, joins into transformers' one-pass decode — past the transformer's
72-frame sliding window and the decoder's whole receptive field — and a request's state goes when it ends
or is aborted, never holding more than one window of keys and values."""

from __future__ import annotations

import pytest
import torch

from omnistage.config.deploy import resolve_deploy
from omnistage.families.qwen3_omni.pipeline import QWEN3_OMNI
from omnistage.runtime.stage_process import create_engine
from omnistage.stages.base import StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.support.codec_stream import stream

pytestmark = pytest.mark.engine

TOLERANCE = 1e-4  # float32 rounding: a wrong carry moves the waveform by ~1e-1


def engine(omni3_dir, **engine_args):  # noqa: ANN001, ANN201
    """The default deployment's code2wav engine (async chunk), its engine_args overridden."""
    overrides = {"2": {"engine_args": engine_args}} if engine_args else None
    deploy = resolve_deploy(QWEN3_OMNI, None, None, overrides)
    return create_engine(QWEN3_OMNI.stage(2), deploy.stage(2), str(omni3_dir), "cpu")


def random_codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (frames, 16), generator=torch.Generator().manual_seed(seed))


def one_pass(code2wav, codes: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    with torch.inference_mode():
        return code2wav(codes.T[None])[0, 0]


def test_streamed_chunks_join_into_the_one_pass_waveform_and_free_their_state(omni3_dir) -> None:
    eng = engine(omni3_dir)
    generator = eng.generator
    assert eng.streams and eng.left_context == 0
    # 200 frames: past the receptive field (2 layers x 71 + 6 frames); 1 frame: a stream's first chunk only
    codes = [random_codes(200, seed=1), random_codes(30, seed=2), random_codes(1, seed=3)]
    got = stream(eng, codes, piece=3)
    assert eng.passes >= 200 // 25 and generator.streams == {}  # chunk after chunk
    for i, c in enumerate(codes):
        want = one_pass(generator.code2wav, c)
        assert got[f"r{i}"].shape == want.shape == (len(c) * 1920 - generator.tail,)
        assert float((got[f"r{i}"] - want).abs().max()) <= TOLERANCE, i
        assert float(want.std()) > 0.05  # audible: a silent decoder would pass any join

    eng.add_request(StageRequest("cut", inputs=GenerationInputs(codes[0][:100]), streaming_input=True))
    decoded = 1 + 3 * 25  # the 1-frame first chunk and three of 25: past one window; the rest waits for 25
    for _ in range(100):
        assert not any(out.finished for out in eng.step())
        cache = generator.streams["cut"].cache
        if cache.get_seq_length() == decoded:
            break
    else:
        raise AssertionError(f"the stream never reached {decoded} frames")
    assert all(layer.keys.shape[2] == 72 - 1 for layer in cache.layers)  # one window, however long the stream
    eng.abort("cut")
    assert generator.streams == {} and not eng.has_work()


def test_receptive_field_context_still_joins_into_the_one_pass_waveform(omni3_dir) -> None:
    """`left_context_frames: exact` decodes each chunk again behind the decoder's receptive field."""
    eng = engine(omni3_dir, left_context_frames="exact")
    assert not eng.streams and eng.left_context == 2 * 72 + 4
    codes = [random_codes(170, seed=4)]
    got = stream(eng, codes, piece=5)
    want = one_pass(eng.generator.code2wav, codes[0])
    assert got["r0"].shape == want.shape
    assert float((got["r0"] - want).abs().max()) <= TOLERANCE
