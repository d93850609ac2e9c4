"""Qwen2.5-Omni code2wav (flow-matching DiT → mel → BigVGAN → 24 kHz) as a generator for the generation
engine, decoding whole code sequences or windows of a growing one.

Network code is transformers' `Qwen2_5OmniToken2WavModel`; what it lacks is an explicit initial state for
the ODE (`sample` draws `torch.randn` from the global generator) and batching several requests. The DiT is
evaluated through `DiTVelocity` (dit_velocity.py): the reference's arithmetic, with the work that does not
change during a solve done once and attention computed block by block over each block's allowed keys (not
as dense masked attention); the MLP's tanh-GELU is computed through a sigmoid. The vocoder's one-channel
upsamplers run as polyphase convolutions (`OneChannelUpSample`: ~27% off a vocoder pass on the benchmark
checkpoint, whose last stages have one or two channels).

*Whole sequences* reproduce the reference exactly: the initial noise is `randn([1, 2·codes, 80])` from a
generator seeded with the request's seed, which is what `generate(return_audio=True)` draws after
`torch.manual_seed(seed)`.

*Windows* (async chunk: the engine decodes `[start - left, end + right)` and keeps `[start, end)`) rest on
three facts, so the joined audio stays within ~1e-5 of the whole-sequence decode:
1. Noise. CPU `randn` fills uniforms in order and transforms them 16 at a time; with 80 values per mel
   frame, the first n frames of a draw are the same whatever its length (a test checks it). A window uses
   the frames of the request's one noise sequence that it covers, as the reference would.
2. DiT. Attention is block-local (24 mel frames = 12 codes per block); a layer in `look_ahead_layers` also
   sees the next block, one in `look_backward_layers` the previous one. Over the 36 velocity evaluations
   of the RK4 solve the reach compounds, but the influence decays geometrically with block distance
   (measured on the tiny checkpoint: ~50-100x per block). Windows start on block boundaries (left context
   and chunk sizes in whole blocks), so their block partition is the reference's, and a chunk is solved
   with whole blocks of context on both sides.
3. Vocoder. BigVGAN is convolutional: an output sample depends on mel frames within a fixed radius
   (`vocoder_radius`, measured once by perturbing a probe). The right context adds that radius, so the
   vocoder never reads the least accurate frames at a window's right edge for emitted audio.

A request's first chunk is the exception, by default: it looks one block ahead instead of two, so its audio
starts 12 codes sooner (time to first audio), and is ~1e-3 off the whole-sequence decode (73-77 dB below the
signal on the benchmark checkpoint; `first_right_blocks: 2` makes it like the others).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import math
from collections.abc import Generator
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
    Qwen2_5OmniUpSample1d,
    RungeKutta4ODESolver,
)

from omnistage.families.qwen2_5_omni.dit_velocity import DiTVelocity
from omnistage.params import GenerationParams
from omnistage.stages.base import EngineContext
from omnistage.stages.engine_args import EngineArgs
from omnistage.stages.generation.engine import GenerationBatch, GenerationEngine, run_to_end

logger = logging.getLogger(__name__)

SAMPLE_RATE = 24000


class SigmoidTanhGELU(torch.nn.Module):
    """GELU's tanh approximation written as x·sigmoid(2u) (= x·(1 + tanh u)/2): the same function to float
    rounding (~4e-7), at half the cost here, where torch's vectorized tanh is slow (the DiT's MLP spent
    ~15% of a solve in it)."""

    SCALE = 2 * math.sqrt(2 / math.pi)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = x * x
        inner.mul_(0.044715 * self.SCALE).add_(self.SCALE).mul_(x)
        return inner.sigmoid_().mul_(x)


class OneChannelUpSample(torch.nn.Module):
    """BigVGAN's anti-aliasing upsampler with a polyphase convolution where the signal has one channel.

    The upsampler is a transposed convolution per channel (`groups=channels`); with a single channel that is
    a plain transposed convolution, which takes PyTorch's slow CPU path (~4x the time of the same filter
    run as `ratio` interleaved phases of an ordinary convolution). Same output to float rounding; other
    channel counts run the original module."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner
        ratio, taps = inner.ratio, inner.filter.shape[-1]
        # phase p of output sample r·j + p is Σ_i x[j - i]·w[r·i + p]: a correlation with w[p::r] reversed
        phases = (inner.filter[0, 0] * ratio).reshape(taps // ratio, ratio).T.flip(-1)
        self.register_buffer("phases", phases[:, None].contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != 1:
            return self.inner(x)
        m = self.inner
        taps = self.phases.shape[-1]
        x = F.pad(F.pad(x, (m.pad, m.pad), mode="replicate"), (taps - 1, taps - 1))
        y = F.conv1d(x, self.phases)  # [B, ratio, L]: phase p of every output step
        return y.transpose(1, 2).reshape(x.shape[0], 1, -1)[..., m.pad_left : -m.pad_right]


@dataclasses.dataclass(frozen=True)
class SolverSettings:
    """The reference's `Qwen2_5OmniToken2WavModel.forward` defaults."""

    num_steps: int = 10
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0


class Token2WavGenerator:
    """`generate(windows, params, starts)` (the engine's `run` passes them): one waveform per code window;
    `starts[i]` is the window's first code in the whole sequence (the noise it gets depends on it).
    `params[i].seed` seeds the request's noise and `params[i].extra["speaker"]` picks its speaker."""

    sample_rate = SAMPLE_RATE
    NOISE_STREAMS = 64

    def __init__(
        self,
        model: Any,
        speakers: dict[str, dict[str, Any]],
        settings: SolverSettings | None = None,
        stop_codes: list[int] | None = None,
    ):
        self.dit = model.code2wav_dit_model.float().eval()
        self.vocoder = model.code2wav_bigvgan_model.float().eval()
        self.speakers = speakers
        self.settings = settings or SolverSettings()
        self.block = int(self.dit.block_size)
        self.repeats = int(self.dit.repeats)
        self.mel_dim = int(self.dit.mel_dim)
        hop = 1
        for rate in self.vocoder.config.upsample_rates:
            hop *= int(rate)
        self.hop = hop
        self.outputs_per_frame = self.repeats * hop
        self.stop_codes = list(stop_codes or [])  # talker tokens that end speech: never decoded
        for layer in self.dit.transformer_blocks:
            mlp = layer.ff.ff
            if isinstance(mlp[1], torch.nn.GELU) and mlp[1].approximate == "tanh":
                mlp[1] = SigmoidTanhGELU()
        for module in list(self.vocoder.modules()):
            upsample = getattr(module, "upsample", None)
            if (
                isinstance(upsample, Qwen2_5OmniUpSample1d)
                and upsample.filter.shape[-1] % upsample.ratio == 0
            ):
                module.upsample = OneChannelUpSample(upsample)
        self.field = DiTVelocity(self.dit)
        self._noise_cache: collections.OrderedDict[int, tuple[torch.Generator, torch.Tensor]] = (
            collections.OrderedDict()
        )

    @property
    def codes_per_block(self) -> int:
        return self.block // self.repeats

    # ----- the generator protocol -------------------------------------------------------------------------
    emits_spans = True

    def run(self, batch: GenerationBatch) -> Generator[None, None, list[torch.Tensor]]:
        """The engine's call: its windows' noise depends on where each starts, and only their spans'
        audio is made."""
        return self.generate_steps(batch.windows, batch.params, batch.starts, batch.spans)

    @torch.inference_mode()
    def generate(
        self,
        windows: list[torch.Tensor],
        params: list[Any],
        starts: list[int],
        spans: list[tuple[int, int]] | None = None,
    ) -> list[torch.Tensor]:
        """Windows of equal length and speaker share one batched DiT solve and one vocoder pass. With
        `spans` ((first code, count) per window) only those codes' audio is returned, and the vocoder runs
        on their mel frames plus its radius instead of the whole window: the same samples (an output sample
        depends on mel frames within the radius only) for less work."""
        return run_to_end(self.generate_steps(windows, params, starts, spans))

    def generate_steps(
        self,
        windows: list[torch.Tensor],
        params: list[Any],
        starts: list[int],
        spans: list[tuple[int, int]] | None = None,
    ) -> Generator[None, None, list[torch.Tensor]]:
        """`generate`, pausing after each ODE step and each vocoder pass (the engine's unit of work)."""
        groups: dict[tuple[int, str], list[int]] = {}
        for i, (window, p) in enumerate(zip(windows, params, strict=True)):
            groups.setdefault((len(window), _speaker(p)), []).append(i)
        results: list[torch.Tensor | None] = [None] * len(windows)
        for (length, speaker), members in groups.items():
            frames = length * self.repeats
            noise = torch.cat(
                [self._noise(_seed(params[i]), starts[i] * self.repeats, frames) for i in members]
            )
            codes = torch.stack([windows[i].long().reshape(-1) for i in members])
            mel = yield from self._solve(noise, codes, speaker)
            if spans is None:
                for i, wav in zip(members, self._vocode(mel), strict=True):
                    results[i] = wav
                yield
                continue
            emitted = [(spans[i][0] * self.repeats, sum(spans[i]) * self.repeats) for i in members]
            lo = max(0, min(a for a, _ in emitted) - self.vocoder_radius)
            hi = min(frames, max(b for _, b in emitted) + self.vocoder_radius)
            for i, (a, b), wav in zip(members, emitted, self._vocode(mel[:, :, lo:hi]), strict=True):
                results[i] = wav[(a - lo) * self.hop : (b - lo) * self.hop]
            yield
        return results

    def decode(self, codes: list[int], speaker: str, seed: int) -> torch.Tensor:
        """The whole-sequence waveform (what the reference returns for these codes and seed)."""
        params = GenerationParams(seed=seed, extra={"speaker": speaker})
        return self.generate([torch.tensor(codes)], [params], [0])[0]

    # ----- the networks ------------------------------------------------------------------------------------
    def _noise(self, seed: int, first: int, frames: int) -> torch.Tensor:
        """Frames [first, first + frames) of the request's initial ODE state, drawn in order as needed.
        The streams of the `NOISE_STREAMS` most recent seeds are kept; an evicted one is drawn again from its
        seed (the same values)."""
        generator, drawn = self._noise_cache.pop(seed, (None, None))
        if generator is None:
            generator = torch.Generator().manual_seed(seed)
            drawn = torch.empty(1, 0, self.mel_dim)
        need = first + frames - drawn.shape[1]
        if need > 0:
            drawn = torch.cat([drawn, torch.randn(1, need, self.mel_dim, generator=generator)], dim=1)
        self._noise_cache[seed] = (generator, drawn)
        while len(self._noise_cache) > self.NOISE_STREAMS:
            self._noise_cache.popitem(last=False)
        return drawn[:, first : first + frames]

    def _solve(
        self, noise: torch.Tensor, codes: torch.Tensor, speaker: str
    ) -> Generator[None, None, torch.Tensor]:
        """The DiT's flow-matching ODE from `noise` [B, T, mel] to mel [B, mel, T]: the reference's
        `sample` with the initial state passed in."""
        s = self.settings
        batch, frames = noise.shape[0], noise.shape[1]
        spk = self.speakers[speaker]
        cond = spk["cond"].float().expand(batch, -1).unsqueeze(1).repeat(1, frames, 1)
        ref_mel = spk["ref_mel"].float().expand(batch, -1, -1)
        guidance = s.guidance_scale >= 1e-5  # the reference's threshold for classifier-free guidance
        model = self.field.prepare(ref_mel, cond, codes, guidance)

        def velocity(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            if not guidance:
                return model(x, t)
            guided, null = torch.chunk(model(x, t), 2, dim=0)
            return guided + (guided - null) * s.guidance_scale

        times = torch.linspace(0, 1, s.num_steps)
        if s.sway_coefficient is not None:
            times = times + s.sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
        # The reference's `RungeKutta4ODESolver.integrate`, one step at a time: its last point is the state
        # after the last step, so stepping by hand gives what `integrate` returns.
        solver = RungeKutta4ODESolver(function=velocity, initial_value=noise)
        x = noise
        for start, end in zip(times[:-1], times[1:], strict=True):
            delta, _ = solver._compute_step(velocity, start, end - start, end, x)
            x = x + delta
            yield
        return x.permute(0, 2, 1)

    def _vocode(self, mel: torch.Tensor) -> torch.Tensor:
        """BigVGAN on mel [B, mel, T] → [B, T·hop] float32 (the model squeezes the batch away)."""
        return self.vocoder(mel).reshape(mel.shape[0], -1).float()

    @functools.cached_property
    def vocoder_radius(self) -> int:
        """Mel frames on either side an output sample depends on: perturb one frame of a probe and see
        which samples move (before the output clamp)."""
        length = 2 * self._radius_bound() + 2
        probe = torch.randn(1, self.mel_dim, length, generator=torch.Generator().manual_seed(0)) - 3.0
        bumped = probe.clone()
        bumped[..., length // 2] += 1.0
        captured: list[torch.Tensor] = []
        hook = self.vocoder.conv_post.register_forward_hook(lambda m, i, o: captured.append(o))
        try:
            with torch.inference_mode():
                self.vocoder(probe)
                self.vocoder(bumped)
        finally:
            hook.remove()
        moved = torch.nonzero((captured[0] - captured[1]).abs()[0, 0] > 0).flatten()
        mid = length // 2
        return max(mid - int(moved.min()) // self.hop, int(moved.max()) // self.hop - mid) + 1

    def _radius_bound(self) -> int:
        """A generous analytic bound on the vocoder radius, only to size the probe."""
        cfg = self.vocoder.config
        block = max(
            sum(d * (k - 1) // 2 + (k - 1) // 2 + 12 for d in dilations)
            for k, dilations in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True)
        )
        rate, bound = 1, 4.0
        for up, kernel in zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True):
            bound += kernel / up / rate + 1
            rate *= up
            bound += block / rate
        return int(bound) + 2


def _speaker(params: Any) -> str:
    return (getattr(params, "extra", None) or {}).get("speaker", "Chelsie")


def _seed(params: Any) -> int:
    seed = getattr(params, "seed", None)
    if seed is None:
        raise ValueError("code2wav needs a seed per request (its input processor sets one)")
    return int(seed)


class Token2WavArgs(EngineArgs):
    """The code2wav stage's `engine_args` (create_engine says what each does)."""

    chunk_blocks: int = 2
    max_chunk_blocks: int = 8
    first_chunk_blocks: int = 1
    left_blocks: int = 3
    right_blocks: int = 2
    first_right_blocks: int = 1
    num_steps: int | None = None
    guidance_scale: float | None = None
    sway_coefficient: float | None = None


def create_engine(ctx: EngineContext) -> GenerationEngine:
    """The code2wav stage: transformers' token2wav behind the generation engine.

    engine_args: `chunk_blocks` (2), `left_blocks` (3), `right_blocks` (2) size async-chunk decoding in DiT
    blocks (12 codes each; the vocoder's radius is added to the right context), `first_chunk_blocks` (1) is
    a request's first chunk (its first audio waits for fewer codes; later windows still start on block
    boundaries) and `first_right_blocks` (1) its look-ahead (audio 12 codes sooner than with 2, for ~1e-3 of
    error in that chunk), `max_chunk_blocks` (8) caps the span a request that fell behind decodes at once;
    `num_steps`, `guidance_scale`, `sway_coefficient` override the solver's defaults. A stage deployed
    with `async_chunk: false` decodes each request in one pass, exactly as the reference.
    """
    from omnistage.families.qwen2_5_omni.loaders import load_token2wav

    args = Token2WavArgs.of(ctx.engine_args)
    model, speakers = load_token2wav(ctx.model_dir, ctx.device)
    solver = {
        k: getattr(args, k)
        for k in ("num_steps", "guidance_scale", "sway_coefficient")
        if getattr(args, k) is not None
    }
    generator = Token2WavGenerator(model, speakers, SolverSettings(**solver), _stop_codes(ctx.model_dir))
    if ctx.deploy.async_chunk is False:
        return GenerationEngine(generator, max_num_seqs=ctx.deploy.max_num_seqs)
    per_block = generator.codes_per_block
    lookahead = -(-generator.vocoder_radius // generator.repeats)
    return GenerationEngine(
        generator,
        max_num_seqs=ctx.deploy.max_num_seqs,
        chunk_size=args.chunk_blocks * per_block,
        max_chunk_size=args.max_chunk_blocks * per_block,
        first_chunk_size=args.first_chunk_blocks * per_block,
        left_context=args.left_blocks * per_block,
        right_context=args.right_blocks * per_block + lookahead,
        first_right_context=args.first_right_blocks * per_block + lookahead,
    )


create_engine.args_type = Token2WavArgs


def _stop_codes(model_dir: str) -> list[int]:
    """The talker tokens that end speech (the reference's `talker_eos_token_id`): never decoded."""
    from transformers import AutoConfig

    talker = AutoConfig.from_pretrained(model_dir).talker_config
    return [talker.tts_codec_pad_token_id, talker.tts_codec_end_token_id]
