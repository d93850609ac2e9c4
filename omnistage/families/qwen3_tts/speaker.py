"""The Base checkpoint's speaker encoder (ECAPA-TDNN, `speaker_encoder.*`): a reference clip's x-vector,
which takes the preset speaker's place in the talker's prompt (voice cloning, x-vector-only mode).

A port of the reference's `Qwen3TTSSpeakerEncoder` and its `mel_spectrogram` (no transformers class holds
them), module for module under the same parameter names; the slaney mel filterbank is transformers'
(`mel_filter_bank`, librosa's filters). Tests prove the embedding equal to the reference's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE = 24000


def mel_spectrogram(audio: torch.Tensor) -> torch.Tensor:
    """[T] float waveform at 24 kHz → log-mel [frames, 128] (n_fft 1024, hop 256, fmax 12 kHz)."""
    from transformers.audio_utils import mel_filter_bank

    n_fft, hop = 1024, 256
    mel = mel_filter_bank(
        num_frequency_bins=n_fft // 2 + 1, num_mel_filters=128, min_frequency=0.0, max_frequency=12000.0,
        sampling_rate=SAMPLE_RATE, norm="slaney", mel_scale="slaney",
    )  # fmt: skip
    basis = torch.from_numpy(np.ascontiguousarray(mel.T)).float()
    pad = (n_fft - hop) // 2
    y = F.pad(audio.float()[None, None], (pad, pad), mode="reflect")[0]
    spec = torch.stft(
        y, n_fft, hop_length=hop, win_length=n_fft, window=torch.hann_window(n_fft), center=False,
        normalized=False, onesided=True, return_complex=True,
    )  # fmt: skip
    spec = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    return torch.log(torch.clamp(basis @ spec, min=1e-5))[0].T


class TDNN(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, dilation: int):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, dilation=dilation, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    def __init__(self, channels: int, scale: int, kernel: int, dilation: int):
        super().__init__()
        self.scale = scale
        part = channels // scale
        self.blocks = nn.ModuleList([TDNN(part, part, kernel, dilation) for _ in range(scale - 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs: list[torch.Tensor] = []
        for i, piece in enumerate(torch.chunk(x, self.scale, dim=1)):
            out = piece if i == 0 else self.blocks[i - 1](piece if i == 1 else piece + outs[-1])
            outs.append(out)
        return torch.cat(outs, dim=1)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, se: int):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, se, 1, padding="same", padding_mode="reflect")
        self.conv2 = nn.Conv1d(se, channels, 1, padding="same", padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))


class SERes2NetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, scale: int, se: int, kernel: int, dilation: int):
        super().__init__()
        self.tdnn1 = TDNN(cin, cout, 1, 1)
        self.res2net_block = Res2Net(cout, scale, kernel, dilation)
        self.tdnn2 = TDNN(cout, cout, 1, 1)
        self.se_block = SqueezeExcitation(cout, se)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x))))


class StatsPooling(nn.Module):
    """Attentive statistics pooling: the attention-weighted mean and std of each channel."""

    def __init__(self, channels: int, attention: int):
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention, 1, 1)
        self.conv = nn.Conv1d(attention, channels, 1, padding="same", padding_mode="reflect")

    @staticmethod
    def _stats(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (weights * x).sum(2)
        std = torch.sqrt((weights * (x - mean[..., None]).pow(2)).sum(2).clamp(1e-12))
        return mean, std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[-1]
        mean, std = self._stats(x, torch.full((1, 1, t), 1.0 / t, dtype=x.dtype, device=x.device))
        context = torch.cat([x, mean[..., None].expand(-1, -1, t), std[..., None].expand(-1, -1, t)], dim=1)
        weights = F.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = self._stats(x, weights)
        return torch.cat([mean, std], dim=1)[..., None]


class SpeakerEncoder(nn.Module):
    """`Qwen3TTSSpeakerEncoder`: log-mel [B, frames, 128] → x-vector [B, enc_dim]."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        ch, ks, dil = cfg["enc_channels"], cfg["enc_kernel_sizes"], cfg["enc_dilations"]
        blocks: list[nn.Module] = [TDNN(cfg.get("mel_dim", 128), ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(
                SERes2NetBlock(
                    ch[i - 1], ch[i], cfg["enc_res2net_scale"], cfg["enc_se_channels"], ks[i], dil[i]
                )
            )
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNN(ch[-1], ch[-1], ks[-1], dil[-1])
        self.asp = StatsPooling(ch[-1], cfg["enc_attention_channels"])
        self.fc = nn.Conv1d(ch[-1] * 2, cfg["enc_dim"], 1, padding="same", padding_mode="reflect")

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        h = mels.transpose(1, 2)
        outs = []
        for block in self.blocks:
            h = block(h)
            outs.append(h)
        h = self.mfa(torch.cat(outs[1:], dim=1))
        return self.fc(self.asp(h)).squeeze(-1)

    @torch.inference_mode()
    def embed(self, audio: torch.Tensor) -> torch.Tensor:
        """A 24 kHz clip's x-vector [enc_dim] (the reference's `extract_speaker_embedding`)."""
        weight = self.fc.weight
        return self(mel_spectrogram(audio.cpu())[None].to(weight.device, weight.dtype))[0]
