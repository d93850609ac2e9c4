"""The codec-decoder stage on the generation engine: the full-handoff waveform equals the reference codec's
decode within 1e-4 (fp32); async chunks decoded as streams (the default) or with the decoder's receptive
field as left context join into the one-pass waveform; with 25 frames of context they equal the reference's
own chunked decode."""

from __future__ import annotations

import pytest
import torch

from omnistage.config.deploy import StageDeploy
from omnistage.config.pipeline import StageSpec
from omnistage.families.qwen3_tts.decoder_stage import create_engine
from omnistage.stages.base import EngineContext, StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.qwen3_tts.reference_outputs import reference_codes, reference_waveforms, tiny_dir
from tests.qwen3_tts.test_talker import reference_requests

pytestmark = pytest.mark.engine

FRAME = 1920  # samples a frame at 24 kHz (12.5 Hz)
TOLERANCE = 1e-4
# Chunks decoded with receptive-field context differ from the one-pass decode by fp32 rounding only: the
# random unit-gain decoder amplifies it to a max of 1.2e-4 (mean 7e-6) on a waveform of std ~0.37, and
# that max stays the same with 200 or 400 frames of context, so it is no context cut.
ASYNC_TOLERANCE = 5e-4


def engine(async_chunk: bool, dtype: str = "auto", **engine_args):  # noqa: ANN201
    deploy = StageDeploy(
        stage_id=1, async_chunk=async_chunk, engine_args=engine_args, max_num_seqs=8, dtype=dtype
    )
    ctx = EngineContext(
        stage=StageSpec(1, "codec", "generation", final_output=True, output_modality="audio"),
        deploy=deploy,
        model_dir=str(tiny_dir("custom_voice")),
    )
    return create_engine(ctx)


def streamed_codes() -> list[torch.Tensor]:
    """The talker's codes and 80 random frames: enough for several chunks past a 25-frame context."""
    return [*codes_under_test()[:-1], codes_under_test()[-1][:80]]


def codes_under_test() -> list[torch.Tensor]:
    """The reference talker's codes for the CustomVoice prompts, and 330 random frames (past the
    reference's 300-frame decode chunk, so its chunk joins are exercised too)."""
    talker = reference_codes(tiny_dir("custom_voice"), reference_requests("custom_voice"))
    noise = torch.randint(0, 2048, (330, 16), generator=torch.Generator().manual_seed(0))
    return [*talker, noise]


def stream(eng, codes: list[torch.Tensor], piece: int = 7) -> dict[str, torch.Tensor]:
    """Feed each request's frames `piece` at a time (as a talker would), step until every request ends."""
    fed = [min(piece, len(c)) for c in codes]
    for i, c in enumerate(codes):
        eng.add_request(StageRequest(f"r{i}", inputs=GenerationInputs(c[: fed[i]]), streaming_input=True))
    audio: dict[str, list[torch.Tensor]] = {f"r{i}": [] for i in range(len(codes))}
    finished: set[str] = set()
    for _ in range(10_000):
        for i, c in enumerate(codes):
            if fed[i] < len(c):
                n = min(piece, len(c) - fed[i])
                eng.add_chunk(f"r{i}", GenerationInputs(c[fed[i] : fed[i] + n]), fed[i] + n >= len(c))
                fed[i] += n
            elif fed[i] == len(c):  # all of it came in the first piece: the talker ends
                eng.add_chunk(f"r{i}", {}, True)
                fed[i] += 1
        for out in eng.step():
            audio[out.request_id].append(out.audio)
            if out.finished:
                finished.add(out.request_id)
        if len(finished) == len(codes):
            return {rid: torch.cat(parts) for rid, parts in audio.items()}
    raise AssertionError(f"requests never finished: {set(audio) - finished}")


def assert_join_one_pass(codec, codes: list[torch.Tensor], got: dict[str, torch.Tensor]) -> None:
    """Each request's joined audio is its one-pass decode, within float32 rounding."""
    for i, c in enumerate(codes):
        with torch.no_grad():
            one_pass = codec(c.T[None])[0, 0]
        assert got[f"r{i}"].shape == one_pass.shape
        err = (got[f"r{i}"] - one_pass).abs()
        assert err.max() <= ASYNC_TOLERANCE and err.mean() <= 2e-5, i


JOIN = (292, 308)  # the frames around the reference's 300-frame chunk join, stored for the long decode


def test_full_handoff_equals_reference() -> None:
    codes = codes_under_test()
    talker, long = codes[:-1], codes[-1]
    expected = reference_waveforms(tiny_dir("custom_voice"), talker)
    expected += reference_waveforms(tiny_dir("custom_voice"), [long], frames=JOIN)
    eng = engine(async_chunk=False)
    for i, c in enumerate(codes):
        eng.add_request(StageRequest(f"r{i}", inputs=GenerationInputs(c)))
    got = {}
    for _ in range(100):
        for out in eng.step():
            got[out.request_id] = out.audio
        if len(got) == len(codes):
            break
    for i, want in enumerate(expected):
        wav = got[f"r{i}"]
        assert wav.shape == (len(codes[i]) * FRAME,)
        if i == len(talker):
            wav = wav[JOIN[0] * FRAME : JOIN[1] * FRAME]
        assert wav.shape == want.shape
        assert (wav - want).abs().max() <= TOLERANCE, i
        assert float(want.std()) > 0.1 and float((want.abs() > 0.999).float().mean()) < 0.05  # not clamped


def test_a_bf16_deployment_decodes_in_bf16_close_to_the_reference() -> None:
    """`dtype: bfloat16` on the stage runs the codec in bf16 (auto keeps the codec config's float32), in
    streamed chunks as in one pass. bf16 rounding through the random decoder moves the waveform 12-15%
    (relative RMS) off the reference's fp32 one: no equality, a correlation bound (0.989-0.993 measured)
    that a broken path fails."""
    assert next(engine(async_chunk=False).generator.codec.parameters()).dtype == torch.float32
    talker = codes_under_test()[:-1]
    expected = reference_waveforms(tiny_dir("custom_voice"), talker)
    for async_chunk in (False, True):
        eng = engine(async_chunk=async_chunk, dtype="bfloat16", chunk_frames=4, first_chunk_frames=2)
        assert next(eng.generator.codec.parameters()).dtype == torch.bfloat16
        got = stream(eng, talker, piece=3)
        for i, want in enumerate(expected):
            wav = got[f"r{i}"]
            assert wav.dtype == torch.float32 and wav.shape == want.shape
            assert float(torch.corrcoef(torch.stack([wav, want]))[0, 1]) >= 0.97, (async_chunk, i)


def test_streamed_chunks_join_into_the_one_pass_waveform_and_free_their_state() -> None:
    """The default async chunk: each chunk decoded once, continuing its request's layer states, joins into
    the one-pass decode (rounding apart, as with receptive-field context: float64 gives 3e-13); a request's
    state goes when it ends or is aborted."""
    codes = streamed_codes()
    eng = engine(async_chunk=True, chunk_frames=25, first_chunk_frames=4)
    codec, generator = eng.generator.codec, eng.generator
    assert eng.streams and eng.left_context == 0
    got = stream(eng, codes)
    assert generator.streams == {}
    assert_join_one_pass(codec, codes, got)
    eng.add_request(StageRequest("cut", inputs=GenerationInputs(codes[-1][:30]), streaming_input=True))
    outputs = eng.step()  # its first chunk: the stream starts
    assert [out.request_id for out in outputs] == ["cut"] and not outputs[0].finished
    assert "cut" in generator.streams
    eng.abort("cut")
    assert generator.streams == {} and not eng.has_work()


def test_async_chunks_join_into_the_one_pass_waveform_with_receptive_field_context() -> None:
    """With the decoder's receptive field as left context every chunk's samples are those of the one-pass
    decode: nothing further back reaches them (all layers causal; see CodecDecoder.context_frames)."""
    codes = streamed_codes()
    eng = engine(async_chunk=True, chunk_frames=25, first_chunk_frames=4, left_context_frames="exact")
    codec = eng.generator.codec
    assert eng.left_context == codec.context_frames() == 2 + 2 * 71 + 10
    got = stream(eng, codes)
    assert_join_one_pass(codec, codes, got)


def test_async_chunks_with_short_context_equal_the_references_chunking() -> None:
    """25 frames of context (the reference's own chunked decode): the joined audio equals the reference
    decoder's `chunked_decode` with 25-frame chunks and 25 frames of context, and differs from the
    one-pass decode once a chunk's context is cut (random weights reach far back)."""
    codes = streamed_codes()
    eng = engine(async_chunk=True, chunk_frames=25, max_chunk_frames=25, left_context_frames=25)
    codec = eng.generator.codec
    got = stream(eng, codes, piece=5)
    long = codes[-1]
    with torch.no_grad():
        chunked = codec.chunked_decode(long.T[None], chunk=25, left=25)[0, 0]
        one_pass = codec(long.T[None])[0, 0]
    assert (got[f"r{len(codes) - 1}"] - chunked).abs().max() <= TOLERANCE
    assert (got[f"r{len(codes) - 1}"] - one_pass).abs().max() > 0.01
