"""Qwen2.5-Omni code2wav (flow-matching DiT → mel → BigVGAN → 24 kHz), whole or streamed chunk by chunk.

Network code is transformers' `Qwen2_5OmniToken2WavModel`; what it lacks is an explicit initial state for
the ODE (it draws `torch.randn` from the global generator) and a way to decode a growing code stream.

Whole decoding reproduces the reference exactly: the initial noise is `randn([1, 2·codes, 80])` from a
generator seeded with the request's seed, which is what `generate(return_audio=True)` draws after
`torch.manual_seed(seed)`.

Streaming (async chunk) rests on three facts:
1. *Noise.* CPU `randn` fills uniforms in order and transforms them 16 at a time, so drawing 80 values per
   mel frame incrementally gives exactly the prefix of the one-shot draw (checked by a test). Each frame
   keeps the noise it has in the reference.
2. *DiT.* Attention is block-local (blocks of 24 mel frames = 12 codes); a layer in `look_ahead_layers`
   sees one block ahead, one in `look_backward_layers` one block back. Across the 36 velocity evaluations of
   the RK4 solve the reach compounds, but the influence decays geometrically with block distance (measured:
   ~50-100× per block on the tiny checkpoint). A chunk is therefore solved on a block-aligned window with
   `left_blocks` of already-final context before it and `right_blocks` of look-ahead after it; only its own
   blocks are kept. Block alignment keeps the window's block partition identical to the reference's.
3. *Vocoder.* BigVGAN is purely convolutional: an output sample depends on mel frames within a fixed
   radius (measured once per model by a perturbation probe). Vocoding a window with that many frames of
   context on each side and trimming reproduces the whole-sequence output to float rounding.
So the only approximation is the DiT's truncated context; its size is the error/latency trade-off.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import torch
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StreamSettings:
    chunk_blocks: int = 1  # DiT blocks finalised per decode (1 block = 12 codes = 0.24 s of audio)
    left_blocks: int = 2  # already-final blocks the DiT window starts with
    right_blocks: int = 2  # look-ahead blocks the DiT window needs before a chunk is final
    num_steps: int = 10
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0


@dataclasses.dataclass
class Token2WavStream:
    """One request's streaming state: codes so far, its noise, final mel frames, vocoded frames."""

    cond: torch.Tensor  # [1, enc_emb_dim]
    ref_mel: torch.Tensor  # [1, T_ref, mel_dim]
    generator: torch.Generator
    codes: list[int] = dataclasses.field(default_factory=list)
    noise: torch.Tensor | None = None  # [1, frames drawn, mel_dim]
    mel: torch.Tensor | None = None  # [1, mel_dim, final frames]
    vocoded: int = 0  # mel frames already turned into audio
    finished: bool = False


class Token2WavDecoder:
    def __init__(self, model: Any, speakers: dict[str, dict[str, Any]], settings: StreamSettings | None = None):
        self.model = model.float().eval()
        self.dit = model.code2wav_dit_model
        self.vocoder = model.code2wav_bigvgan_model
        self.speakers = speakers
        self.settings = settings or StreamSettings()
        self.block = int(self.dit.block_size)
        self.repeats = int(self.dit.repeats)
        self.mel_dim = int(self.dit.mel_dim)
        self.hop = 1
        for rate in self.vocoder.config.upsample_rates:
            self.hop *= int(rate)

    # ----- whole sequences (full handoff) -----------------------------------------------------------------

    @torch.no_grad()
    def decode(self, codes: list[int], speaker: str, seed: int) -> torch.Tensor:
        """The reference waveform for `codes` (float32 mono)."""
        stream = self.open(speaker, seed)
        noise = self._noise(stream, len(codes) * self.repeats)
        mel = self._solve(noise, torch.tensor([codes]), stream.cond, stream.ref_mel)
        return self._vocode(mel)[0]

    # ----- streams (async chunk) ---------------------------------------------------------------------------

    def open(self, speaker: str, seed: int) -> Token2WavStream:
        spk = self.speakers[speaker]
        return Token2WavStream(
            cond=spk["cond"].float(),
            ref_mel=spk["ref_mel"].float(),
            generator=torch.Generator().manual_seed(int(seed)),
        )

    @torch.no_grad()
    def feed(self, stream: Token2WavStream, codes: list[int], last: bool) -> torch.Tensor:
        """Take more codes; return the audio that became final (possibly empty)."""
        stream.codes.extend(int(c) for c in codes)
        stream.finished = stream.finished or last
        parts = []
        while (window := self._next_window(stream)) is not None:
            self._finalise_mel(stream, *window)
            parts.append(self._vocode_ready(stream))
        if stream.finished:
            parts.append(self._vocode_ready(stream))
        parts = [p for p in parts if p.numel()]
        return torch.cat(parts) if parts else torch.zeros(0)

    def _next_window(self, stream: Token2WavStream) -> tuple[int, int, int] | None:
        """(window start frame, emit start frame, emit end frame) of the next chunk the codes allow."""
        s, block = self.settings, self.block
        total = len(stream.codes) * self.repeats
        done = 0 if stream.mel is None else stream.mel.shape[-1]
        if done >= total:
            return None
        emit_end = done + s.chunk_blocks * block
        if not stream.finished and emit_end + s.right_blocks * block > total:
            return None
        emit_end = min(emit_end, total)
        return max(0, done - s.left_blocks * block), done, emit_end

    def _finalise_mel(self, stream: Token2WavStream, start: int, emit: int, emit_end: int) -> None:
        s, total = self.settings, len(stream.codes) * self.repeats
        end = min(total, emit_end + s.right_blocks * self.block)
        if stream.finished:
            end = total
        noise = self._noise(stream, end)[:, start:end]
        codes = torch.tensor([stream.codes[start // self.repeats : end // self.repeats]])
        mel = self._solve(noise, codes, stream.cond, stream.ref_mel)[..., emit - start : emit_end - start]
        stream.mel = mel if stream.mel is None else torch.cat([stream.mel, mel], dim=-1)

    def _vocode_ready(self, stream: Token2WavStream) -> torch.Tensor:
        """Vocode the final mel frames whose receptive field is complete (all of them at the end)."""
        if stream.mel is None:
            return torch.zeros(0)
        radius = self.vocoder_radius
        done = stream.mel.shape[-1]
        stop = done if stream.finished and self._next_window(stream) is None else done - radius
        if stop <= stream.vocoded:
            return torch.zeros(0)
        start = max(0, stream.vocoded - radius)
        wav = self._vocode(stream.mel[..., start : min(done, stop + radius)])[0]
        wav = wav[(stream.vocoded - start) * self.hop : (stop - start) * self.hop]
        stream.vocoded = stop
        return wav

    # ----- the networks ------------------------------------------------------------------------------------

    def _noise(self, stream: Token2WavStream, frames: int) -> torch.Tensor:
        """The stream's initial ODE state for frames [0, frames), drawn in order as it grows."""
        have = 0 if stream.noise is None else stream.noise.shape[1]
        if frames > have:
            more = torch.randn(1, frames - have, self.mel_dim, generator=stream.generator)
            stream.noise = more if stream.noise is None else torch.cat([stream.noise, more], dim=1)
        return stream.noise[:, :frames]

    def _solve(
        self, noise: torch.Tensor, codes: torch.Tensor, cond: torch.Tensor, ref_mel: torch.Tensor
    ) -> torch.Tensor:
        """The DiT's flow-matching ODE from `noise` [B, T, mel] → mel [B, mel, T] (the reference's `sample`
        with the initial state passed in)."""
        s, dit = self.settings, self.dit
        frames = noise.shape[1]
        batch = noise.shape[0]
        cond = cond.expand(batch, -1).unsqueeze(1).repeat(1, frames, 1)
        ref_mel = ref_mel.expand(batch, -1, -1)

        def velocity(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            inputs = {"hidden_states": x, "condition_vector": ref_mel, "speaker_embedding": cond}
            if s.guidance_scale < 1e-5:
                return dit(**inputs, quantized_code=codes, time_step=t, apply_cfg=False)
            out = dit(**inputs, quantized_code=codes, time_step=t, apply_cfg=True)
            guided, null = torch.chunk(out, 2, dim=0)
            return guided + (guided - null) * s.guidance_scale

        times = torch.linspace(0, 1, s.num_steps, dtype=cond.dtype)
        if s.sway_coefficient is not None:
            times = times + s.sway_coefficient * (torch.cos(torch.pi / 2 * times) - 1 + times)
        return RungeKutta4ODESolver(function=velocity, initial_value=noise).integrate(times)[-1].permute(0, 2, 1)

    def _vocode(self, mel: torch.Tensor) -> torch.Tensor:
        """BigVGAN on mel [B, mel, T] → [B, T·hop] float32 (the model squeezes its batch away)."""
        return self.vocoder(mel).reshape(mel.shape[0], -1).float()

    @functools.cached_property
    def vocoder_radius(self) -> int:
        """Mel frames on each side an output sample depends on, found by perturbing one frame of a probe."""
        probe_len = 8 * max(8, self._analytic_radius())
        mel = torch.randn(1, self.mel_dim, probe_len, generator=torch.Generator().manual_seed(0)) - 3.0
        bumped = mel.clone()
        mid = probe_len // 2
        bumped[..., mid] += 1.0
        captured: list[torch.Tensor] = []
        hook = self.vocoder.conv_post.register_forward_hook(lambda m, i, o: captured.append(o))
        try:
            with torch.no_grad():
                self.vocoder(mel)
                self.vocoder(bumped)
        finally:
            hook.remove()
        changed = torch.nonzero((captured[0] - captured[1]).abs()[0, 0] > 0).flatten()
        reach = max(mid - int(changed.min()) // self.hop, int(changed.max()) // self.hop - mid)
        return reach + 1

    def _analytic_radius(self) -> int:
        """A generous bound used only to size the probe."""
        cfg = self.vocoder.config
        per_block = max(sum(d * (k - 1) // 2 + (k - 1) // 2 + 12 for d in dil) for k, dil in
                        zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes, strict=True))
        rate, radius = 1, 4.0
        for up, kernel in zip(cfg.upsample_rates, cfg.upsample_kernel_sizes, strict=True):
            radius += kernel / up / rate + 1
            rate *= up
            radius += per_block / rate
        return int(radius) + 2
