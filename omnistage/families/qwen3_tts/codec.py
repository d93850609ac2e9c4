"""The Qwen3-TTS 12 Hz codec's decoder (`speech_tokenizer/`): 16 codebooks a frame → 24 kHz waveform, 1920
samples a frame.

The reference's module (`Qwen3TTSTokenizerV2Decoder`, qwen-tts-hf) cannot be imported beside transformers
5.24 and transformers has no class for it, so this is a port of its network, module for module under the
same parameter names (the checkpoint's `decoder.*` weights load as they are); tests prove its waveform
equal to the reference's within 1e-4. Split RVQ dequantizer → causal conv → a sliding-window (72 frames)
transformer with layer scales → 2 ConvNeXt upsamplers → SnakeBeta conv decoder blocks.

Causality bounds the context a frame needs: every conv is causal, the transformer looks back 72 frames per
layer, so a chunk decoded with enough left context equals the same samples of a one-pass decode
(`chunked_decode`, as the reference decodes: 300-frame chunks, 25 frames of left context). Causality also
lets a stream be decoded chunk after chunk with no context recomputed at all: each causal conv keeps the
last inputs it will read again, the transformer its last 71 frames' keys and values (a `StreamState` per
stream), and the chunks join into the one-pass waveform up to float rounding.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

SUBFOLDER = "speech_tokenizer"


class StreamState(dict):
    """One stream's carried state, by layer: what each causal layer will read again of the frames it has
    seen (a conv's last inputs, the transformer's keys and values, the next frame's position)."""


class CausalConv(nn.Module):
    """A causal conv over [B, C, T], or over the decoder's channels-last [B, C, 1, T] (see CodecDecoder)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.kernel_size = (kernel - 1) * dilation + 1
        self.padding = self.kernel_size - stride

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        length = x.shape[-1]
        if self.stride == 1:
            conv = self.conv
            weight = conv.weight if x.dim() == 3 else _laid_out(self, conv.weight, lambda w: w)
            if state is not None:  # the padding is this stream's last inputs
                return _conv(_carry(state, self, x, self.padding), weight, conv.bias, 0, conv)
            # the zero padding inside the convolution (no padded copy of x); the first `length` outputs
            # see only the past
            return _conv(x, weight, conv.bias, self.padding, conv)[..., :length]
        if x.dim() == 4:
            raise ValueError("a strided causal conv takes [B, C, T]")
        frames = (length - self.kernel_size + self.padding) / self.stride + 1
        extra = (math.ceil(frames) - 1) * self.stride + (self.kernel_size - self.padding) - length
        return self.conv(F.pad(x, (self.padding, extra)))


def _conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pad: int, conv: nn.Conv1d):
    """conv1d on [B, C, T]; on channels-last [B, C, 1, T] the same convolution as a conv2d."""
    if x.dim() == 3:
        return F.conv1d(x, weight, bias, 1, pad, conv.dilation, conv.groups)
    return F.conv2d(x, weight, bias, 1, (0, pad), (1, conv.dilation[0]), conv.groups)


def _laid_out(owner: nn.Module, weight: torch.Tensor, make: Any) -> torch.Tensor:
    """`make(weight)` ([Cout, Cin, K]) as a conv2d over channels-last [B, C, 1, T] takes it: [Cout, Cin, 1, K]
    channels-last. Made once per weight tensor and kept on `owner` (for inference: a weight edited in place
    afterwards is not seen)."""
    key = (weight.data_ptr(), weight.dtype, weight.device)
    kept = owner.__dict__.get("_laid_out")
    if kept is None or kept[0] != key:
        with torch.no_grad():
            made = make(weight).unsqueeze(2).contiguous(memory_format=torch.channels_last)
        kept = owner.__dict__["_laid_out"] = (key, made)
    return kept[1]


class CausalTransConv(nn.Module):
    """A transposed convolution, its output cut to `stride` samples per input frame.

    With kernel = 2 x stride (every decoder block's), output sample t*s + r is W[:, :, r] of frame t plus
    W[:, :, r + s] of frame t - 1: a causal 2-tap convolution to s x cout channels (r major). On the
    decoder's channels-last [B, C, 1, T] those channels already lie in memory as s samples of cout channels
    per frame, so the upsampled [B, cout, 1, T * s] is a view, no copy. That is the same sum of products
    (rounded in another order, ~1e-6 apart) as the transposed convolution, which oneDNN computes 1.3-2.3x
    slower here (one AMX Xeon thread, fp32)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.right_pad = kernel - stride

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        stride, kernel = self.conv.stride[0], self.conv.kernel_size[0]
        if kernel == 2 * stride:
            if x.dim() != 4:
                raise ValueError("a kernel-2s transposed conv takes channels-last [B, C, 1, T]")
            weight = _laid_out(self, self.conv.weight, self._two_taps)
            bias = self.conv.bias.repeat(stride) if self.conv.bias is not None else None
            batch, _, _, frames = x.shape
            if state is None:
                out = F.conv2d(x, weight, bias, padding=(0, 1))[..., :frames]  # [B, s * cout, 1, T]
            else:
                out = F.conv2d(_carry(state, self, x, 1), weight, bias)
            out = out.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)  # [B, 1, T, s*cout]
            up = out.reshape(batch, 1, frames * stride, -1).permute(0, 3, 1, 2)  # [B, cout, 1, T*s]
            return up
        if state is not None and kernel != stride:
            raise ValueError(f"a transposed conv of kernel {kernel}, stride {stride} cannot stream")
        x = self.conv(x)
        return x[..., : x.shape[-1] - self.right_pad] if self.right_pad else x

    def _two_taps(self, w: torch.Tensor) -> torch.Tensor:
        """[cin, cout, 2s] → the 2-tap weights [s * cout, cin, 2]: channel r * cout + o, taps (t-1, t)."""
        s = self.conv.stride[0]
        taps = torch.stack([w[:, :, s:], w[:, :, :s]], dim=-1)  # [cin, cout, s, (t-1, t)]
        return taps.permute(2, 1, 0, 3).reshape(-1, w.shape[0], 2).contiguous()


def _carry(state: StreamState, layer: nn.Module, x: torch.Tensor, width: int) -> torch.Tensor:
    """x after the `width` inputs `layer` saw last in this stream (zeros at its start, as the one-pass
    padding), keeping the new last `width` for the next chunk."""
    if width == 0:
        return x
    past = state.get(layer)
    if past is None:
        past = x.new_zeros(*x.shape[:-1], width)
    joined = torch.cat([past, x], dim=-1)
    if joined.dim() == 4:
        joined = joined.contiguous(memory_format=torch.channels_last)
    state[layer] = joined[..., joined.shape[-1] - width :].clone()
    return joined


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        h = self.norm(self.dwconv(x, state).permute(0, 2, 1))
        h = self.gamma * self.pwconv2(self.act(self.pwconv1(h)))
        return x + h.permute(0, 2, 1)


class SnakeBeta(nn.Module):
    """x + 1/exp(beta) * sin^2(x * exp(alpha)), per channel."""

    def __init__(self, dim: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1) + (1,) * (x.dim() - 2)  # per channel of [B, C, T] or [B, C, 1, T]
        alpha = torch.exp(self.alpha).view(shape)
        scale = 1.0 / (torch.exp(self.beta).view(shape) + 1e-9)
        if torch.is_grad_enabled():
            return x + scale * torch.pow(torch.sin(x * alpha), 2)
        # the same ops in place on one buffer (bit-identical): the waveform-rate activations are tens of
        # MB, and each fresh one costs its page faults
        out = torch.mul(x, alpha).sin_()
        return out.mul_(out).mul_(scale).add_(x)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x), state)))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        units = [ResidualUnit(cout, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        for layer in self.block:
            x = layer(x) if isinstance(layer, SnakeBeta) else layer(x, state)
        return x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class Attention(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        width, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        self.heads, self.kv_heads = heads, cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim") or width // heads
        bias = cfg.get("attention_bias", False)
        self.q_proj = nn.Linear(width, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, width, bias=bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        state: StreamState | None = None,
        keep: int = 0,
    ) -> torch.Tensor:
        """`state`: the stream's keys and values before x's (as many as `mask` has extra columns); the
        last `keep` of them and x's are kept for the next chunk."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if state is not None:
            past = state.get(self)
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            first = max(0, k.shape[2] - keep)  # not `-keep:`, which keeps everything when keep is 0
            state[self] = (k[:, :, first:].clone(), v[:, :, first:].clone())
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Mlp(nn.Module):
    def __init__(self, width: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(width, inner, bias=False)
        self.up_proj = nn.Linear(width, inner, bias=False)
        self.down_proj = nn.Linear(inner, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        width, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-5)
        self.self_attn = Attention(cfg)
        self.mlp = Mlp(width, cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(width, eps)
        self.post_attention_layernorm = RMSNorm(width, eps)
        self.self_attn_layer_scale = LayerScale(width)
        self.mlp_layer_scale = LayerScale(width)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        state: StreamState | None = None,
        keep: int = 0,
    ) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), cos, sin, mask, state, keep)
        x = x + self.self_attn_layer_scale(attended)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        width = cfg["hidden_size"]
        self.layers = nn.ModuleList([TransformerLayer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(width, cfg.get("rms_norm_eps", 1e-5))
        self.input_proj = nn.Linear(cfg["latent_dim"], width)
        self.output_proj = nn.Linear(width, cfg["latent_dim"])
        self.window = cfg["sliding_window"]
        head_dim = cfg.get("head_dim") or width // cfg["num_attention_heads"]
        steps = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.register_buffer(
            "inv_freq", 1.0 / (float(cfg.get("rope_theta", 10000)) ** steps), persistent=False
        )

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """x [B, T, latent]; in a stream, its frames follow the `state[self]` frames seen before."""
        t, start = x.shape[1], 0 if state is None else state.get(self, 0)
        pos = torch.arange(start, start + t, device=x.device)
        freqs = pos[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        keys = pos
        if state is not None:  # the keys kept from earlier chunks: up to window - 1 frames back
            keys = torch.arange(max(0, start - self.window + 1), start + t, device=x.device)
            state[self] = start + t
        back = pos[:, None] - keys[None, :]
        mask = (back >= 0) & (back < self.window)  # causal, `window` frames including itself
        h = self.input_proj(x)
        for layer in self.layers:
            h = layer(h, cos, sin, mask, state, self.window - 1)
        return self.output_proj(self.norm(h))


class Codebook(nn.Module):
    def __init__(self, dim: int, size: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return F.embedding(codes, self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None])


class VectorQuantization(nn.Module):
    def __init__(self, dim: int, size: int):
        super().__init__()
        self._codebook = Codebook(dim, size)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self._codebook.decode(codes).transpose(1, 2)


class ResidualVQ(nn.Module):
    def __init__(self, dim: int, size: int, count: int):
        super().__init__()
        self.layers = nn.ModuleList([VectorQuantization(dim, size) for _ in range(count)])


class RVQ(nn.Module):
    def __init__(self, dim: int, io_dim: int, size: int, count: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # encoder side; kept for the weights
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = ResidualVQ(dim, size, count)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] → [B, io_dim, T]."""
        total = sum(layer.decode(codes[:, i]) for i, layer in enumerate(self.vq.layers))
        return self.output_proj(total)


class SplitRVQ(nn.Module):
    def __init__(self, dim: int, io_dim: int, size: int, count: int):
        super().__init__()
        self.rvq_first = RVQ(dim, io_dim, size, 1)
        self.rvq_rest = RVQ(dim, io_dim, size, count - 1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


class CodecDecoder(nn.Module):
    """`Qwen3TTSTokenizerV2Decoder`: codes [B, 16, T] → waveform [B, 1, T * upsample] in [-1, 1]."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        latent, dim = cfg["latent_dim"], cfg["decoder_dim"]
        rates, ratios = list(cfg["upsample_rates"]), list(cfg["upsampling_ratios"])
        self.num_quantizers = cfg["num_quantizers"]
        self.total_upsample = math.prod(rates + ratios)
        self.pre_transformer = PreTransformer(cfg)
        book = cfg["codebook_dim"]
        self.quantizer = SplitRVQ(book // 2, book, cfg["codebook_size"], cfg["num_quantizers"])
        self.pre_conv = CausalConv(book, latent, 3)
        self.upsample = nn.ModuleList(
            [nn.ModuleList([CausalTransConv(latent, latent, f, f), ConvNeXtBlock(latent)]) for f in ratios]
        )
        blocks = [DecoderBlock(dim // 2**i, dim // 2 ** (i + 1), r) for i, r in enumerate(rates)]
        out = dim // 2 ** len(rates)
        self.decoder = nn.ModuleList(
            [CausalConv(latent, dim, 7), *blocks, SnakeBeta(out), CausalConv(out, 1, 7)]
        )

    def forward(self, codes: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """codes [B, 16, T] → waveform [B, 1, T * 1920]. With a `state`, the codes continue the stream it
        carries (empty: a new stream) and the state moves on past them."""
        if codes.shape[1] != self.num_quantizers:
            raise ValueError(f"expected {self.num_quantizers} codebooks, got {codes.shape[1]}")
        h = self.pre_conv(self.quantizer.decode(codes), state).transpose(1, 2)
        h = self.pre_transformer(h, state).permute(0, 2, 1)
        for blocks in self.upsample:
            for block in blocks:
                h = block(h, state)
        # The convolutions from 50 Hz up to 24 kHz run channels-last, as [B, C, 1, T] conv2d: oneDNN computes
        # them 1.1-1.6x faster so in fp32 and ~4-7x in bf16, where channels-first costs layout copies around
        # every call (one AMX Xeon thread), and the upsampling between them is then a view.
        h = h.unsqueeze(2).contiguous(memory_format=torch.channels_last)
        for block in self.decoder:
            h = block(h) if isinstance(block, SnakeBeta) else block(h, state)
        return h.squeeze(2).clamp(min=-1, max=1)

    def context_frames(self) -> int:
        """How many earlier frames a frame's samples can depend on (the decoder's receptive field, in
        frames): a chunk decoded with this much left context equals the one-pass decode. The transformer
        reaches `window - 1` frames back per layer; each causal conv `kernel - 1` samples at its rate."""
        back = (self.pre_conv.kernel_size - 1) + len(self.pre_transformer.layers) * (
            self.pre_transformer.window - 1
        )
        per, samples = 1, 0.0  # output samples per frame at the current layer; look-back in frames
        for up, convnext in self.upsample:
            per *= up.conv.stride[0]
            samples += (convnext.dwconv.kernel_size - 1) / per
        for block in self.decoder:
            if isinstance(block, CausalConv):
                samples += (block.kernel_size - 1) / per
            elif isinstance(block, DecoderBlock):
                trans = block.block[1].conv
                samples += (trans.kernel_size[0] // trans.stride[0] - 1) / per
                per *= trans.stride[0]
                samples += sum(unit.conv1.kernel_size - 1 for unit in block.block[2:]) / per
        return back + math.ceil(samples)

    def chunked_decode(self, codes: torch.Tensor, chunk: int = 300, left: int = 25) -> torch.Tensor:
        """The reference's decode: `chunk` frames at a time, each with up to `left` frames of context."""
        wavs, start = [], 0
        while start < codes.shape[-1]:
            end = min(start + chunk, codes.shape[-1])
            context = left if start - left > 0 else start
            wavs.append(self(codes[..., start - context : end])[..., context * self.total_upsample :])
            start = end
        return torch.cat(wavs, dim=-1)


@torch.inference_mode()
def load_codec(model_dir: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> CodecDecoder:
    """The decoder of `model_dir`/speech_tokenizer (or of a codec directory itself)."""
    from safetensors.torch import load_file

    path = Path(model_dir)
    if (path / SUBFOLDER / "config.json").exists():
        path = path / SUBFOLDER
    cfg = json.loads((path / "config.json").read_text())["decoder_config"]
    model = CodecDecoder(cfg)
    state = {k.removeprefix("decoder."): v for k, v in load_file(str(path / "model.safetensors")).items()}
    state = {k: v for k, v in state.items() if not k.startswith("encoder.")}
    missing, unexpected = model.load_state_dict(
        {k: v for k, v in state.items() if k in model.state_dict()}, strict=False
    )
    if missing:
        raise ValueError(f"{path}: codec decoder weights missing: {missing[:8]}")
    return model.to(device, dtype).eval()
