"""code2wav: whole decodes equal the reference; windowed (async-chunk) decodes stay within the tolerance the
three facts in token2wav.py give, and only thanks to the context."""

import pytest
import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniUpSample1d

from omnistage.config.deploy import StageDeploy
from omnistage.families.qwen2_5_omni.loaders import load_token2wav
from omnistage.families.qwen2_5_omni.pipeline import QWEN2_5_OMNI
from omnistage.families.qwen2_5_omni.token2wav import (
    OneChannelUpSample,
    SigmoidTanhGELU,
    Token2WavGenerator,
    create_engine,
)
from omnistage.params import GenerationParams
from omnistage.stages.base import EngineContext, StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from tests.qwen2_5_omni.conftest import ASYNC_TOLERANCE, assert_async_audio_close, first_chunk_samples

pytestmark = pytest.mark.engine
CODE2WAV = QWEN2_5_OMNI.stage(2)


@pytest.fixture(scope="module")
def generator(omni_dir):
    model, speakers = load_token2wav(omni_dir)
    return Token2WavGenerator(model, speakers)


@pytest.fixture(scope="module")
def codes():
    return torch.randint(0, 8192, (72,), generator=torch.Generator().manual_seed(3)).tolist()


def engine(omni_dir, async_chunk: bool, **engine_args):
    deploy = StageDeploy(stage_id=2, async_chunk=async_chunk, engine_args=engine_args)
    return create_engine(EngineContext(CODE2WAV, deploy, str(omni_dir)))


def stream(eng, codes, step: int, seed: int = 0) -> tuple[torch.Tensor, int]:
    """Feed `codes` `step` at a time as a talker would; return the joined audio and how many pieces came."""
    params = GenerationParams(seed=seed, extra={"speaker": "Chelsie"})
    first = GenerationInputs(torch.tensor(codes[:step]))
    eng.add_request(StageRequest("r", params=params, inputs=first, streaming_input=True))
    pieces = drain(eng)
    for start in range(step, len(codes), step):
        eng.add_chunk(
            "r", GenerationInputs(torch.tensor(codes[start : start + step])), last=start + step >= len(codes)
        )
        pieces += drain(eng)
    audio = [o.audio for o in pieces if o.audio.numel()]
    assert pieces[-1].finished
    return torch.cat(audio), len(audio)


def drain(eng) -> list:
    outs = []
    while eng.has_work():
        outs += eng.step()
    return outs


def test_randn_prefix_property():
    """Drawing the noise frame by frame gives the one-shot draw's prefix (80 values per mel frame)."""
    whole = torch.randn(1, 100, 80, generator=torch.Generator().manual_seed(5))
    gen = torch.Generator().manual_seed(5)
    parts = torch.cat([torch.randn(1, n, 80, generator=gen) for n in (1, 7, 24, 68)], dim=1)
    assert torch.equal(whole, parts)


def test_sigmoid_form_equals_tanh_gelu():
    x = torch.linspace(-12, 12, 20001)
    expected = torch.nn.functional.gelu(x.double(), approximate="tanh")
    assert float((SigmoidTanhGELU()(x) - expected).abs().max()) < 2e-6
    assert float((torch.nn.functional.gelu(x, approximate="tanh") - expected).abs().max()) < 2e-6


@pytest.mark.parametrize(("ratio", "taps"), [(2, 12), (3, 9)])
@pytest.mark.parametrize("channels", [1, 3])
def test_polyphase_upsampler_equals_the_transposed_convolution(ratio, taps, channels):
    upsample = Qwen2_5OmniUpSample1d(ratio, taps)
    x = torch.randn(2, channels, 41, generator=torch.Generator().manual_seed(ratio))
    expected = upsample(x)
    got = OneChannelUpSample(upsample)(x)
    assert got.shape == expected.shape == (2, channels, 41 * ratio)
    assert float((got - expected).abs().max()) < 1e-6


def test_whole_decode_equals_reference_token2wav(generator, reference_model, codes):
    spk = reference_model.speaker_map["Ethan"]
    torch.manual_seed(11)
    with torch.no_grad():
        expected = reference_model.token2wav(
            torch.tensor([codes]), conditioning=spk["cond"].float(), reference_mel=spk["ref_mel"].float()
        ).reshape(-1)
    got = generator.decode(codes, "Ethan", seed=11)
    assert got.shape == expected.shape == (len(codes) * 480,)
    assert float(expected.std()) > 0.05  # an audible signal, not a near-zero one
    assert float((got - expected).abs().max()) <= 1e-5


def test_vocoder_windows_with_radius_context_are_exact(generator):
    mel = torch.randn(1, 80, 120, generator=torch.Generator().manual_seed(2)) - 3.0
    with torch.no_grad():
        whole = generator._vocode(mel)[0]
    r, hop = generator.vocoder_radius, generator.hop
    assert 1 < r < 60
    pieces = []
    for start in range(0, 120, 30):
        lo, hi = max(0, start - r), min(120, start + 30 + r)
        with torch.no_grad():
            out = generator._vocode(mel[..., lo:hi])[0]
        pieces.append(out[(start - lo) * hop : (start - lo + 30) * hop])
    assert float((torch.cat(pieces) - whole).abs().max()) < 1e-5


def test_spans_return_the_emitted_part_of_the_whole_window(generator, codes):
    """With spans the vocoder runs on the emitted frames plus its radius only: the same samples."""
    windows = [torch.tensor(codes[:48]), torch.tensor(codes[12:60])]
    params = [GenerationParams(seed=s, extra={"speaker": "Chelsie"}) for s in (1, 2)]
    whole = generator.generate(windows, params, [0, 12])
    spans = [(0, 12), (24, 12)]
    trimmed = generator.generate(windows, params, [0, 12], spans)
    for full, part, (skip, count) in zip(whole, trimmed, spans, strict=True):
        per = generator.outputs_per_frame
        assert part.shape == (count * per,)
        assert float((part - full[skip * per : (skip + count) * per]).abs().max()) < 1e-5


def test_full_handoff_engine_decodes_once_and_exactly(omni_dir, generator, codes):
    eng = engine(omni_dir, async_chunk=False)
    params = GenerationParams(seed=4, extra={"speaker": "Chelsie"})
    eng.add_request(StageRequest("r", params=params, inputs=GenerationInputs(torch.tensor(codes))))
    outs = drain(eng)
    assert len(outs) == 1 and outs[0].finished and eng.passes == 1
    assert outs[0].sample_rate == 24000
    assert float((outs[0].audio - generator.decode(codes, "Chelsie", 4)).abs().max()) <= 1e-6


def test_async_chunks_match_whole_decode_within_tolerance(omni_dir, generator, codes):
    whole = generator.decode(codes, "Chelsie", seed=0)
    audio, pieces = stream(engine(omni_dir, async_chunk=True), codes, step=5)
    assert pieces >= 2
    assert_async_audio_close(audio, whole, omni_dir)
    # Without context the chunk edges are audibly wrong: the tolerance above is earned by the context.
    blind, _ = stream(engine(omni_dir, async_chunk=True, left_blocks=0, right_blocks=0), codes, step=5)
    assert float((blind - whole).abs().max()) > 1e-3


def test_first_chunk_look_ahead_is_a_setting(omni_dir, generator, codes):
    """By default the first chunk looks one block ahead (its audio starts 12 codes sooner, ~1e-3 off);
    `first_right_blocks: 2` gives it the later chunks' look-ahead and their tolerance."""
    lookahead = -(-generator.vocoder_radius // generator.repeats)
    whole = generator.decode(codes, "Chelsie", seed=0)
    first = first_chunk_samples(omni_dir)
    assert first == 12 * generator.outputs_per_frame
    default = engine(omni_dir, async_chunk=True)
    assert default.right_context == 24 + lookahead and default.first_right_context == 12 + lookahead
    audio, _ = stream(default, codes, step=5)
    assert float((audio[:first] - whole[:first]).abs().max()) > 1e-4
    eng = engine(omni_dir, async_chunk=True, first_right_blocks=2)
    assert eng.first_right_context == eng.right_context
    audio, _ = stream(eng, codes, step=5)
    assert float((audio - whole).abs().max()) <= ASYNC_TOLERANCE


@pytest.mark.parametrize("guidance", [True, False])
def test_velocity_field_equals_the_dit_forward_for_interleaved_solves(generator, guidance):
    """`DiTVelocity` (per-solve constants hoisted, fused projections) computes the DiT's own forward, also
    when another solve was prepared in between (the engine pauses solves between ODE steps)."""
    dit, speaker = generator.dit, generator.speakers["Chelsie"]
    gen = torch.Generator().manual_seed(7)

    def case(batch, codes_len):
        frames = codes_len * generator.repeats
        codes = torch.randint(0, 8000, (batch, codes_len), generator=gen)
        cond = speaker["cond"].float().expand(batch, -1).unsqueeze(1).repeat(1, frames, 1)
        ref_mel = speaker["ref_mel"].float().expand(batch, -1, -1)
        x = torch.randn(batch, frames, generator.mel_dim, generator=gen)
        return codes, cond, ref_mel, x

    first, second = case(2, 30), case(1, 43)
    with torch.inference_mode():
        models = [
            generator.field.prepare(ref, cond, codes, guidance) for codes, cond, ref, _ in (first, second)
        ]
        for model, (codes, cond, ref, x) in zip(models, (first, second), strict=True):
            for t in (0.0, 0.37):
                t = torch.tensor(t)
                expected = dit(
                    hidden_states=x,
                    time_step=t,
                    apply_cfg=guidance,
                    condition_vector=ref,
                    speaker_embedding=cond,
                    quantized_code=codes,
                )
                got = model(x, t)
                assert got.shape == expected.shape == (x.shape[0] * (2 if guidance else 1), *x.shape[1:])
                assert float((got - expected).abs().max()) <= 1e-5 * max(1.0, float(expected.abs().max()))
