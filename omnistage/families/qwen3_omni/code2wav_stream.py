"""Decode a request's frames as one stream through transformers' `Qwen3OmniMoeCode2Wav`, chunk after chunk,
with no frame decoded twice.

The network is causal but for one thing: each decoder block's transposed convolution (kernel 2s, stride s,
s samples cut from each end) makes output step k from input steps k and k + 1, so a decode of T frames ends
`tail` (555) samples short of T × 1920, and those samples come with the next frame. Everything else looks
only back: each causal convolution reads its last `kernel - 1` inputs again (carried as the next chunk's
padding), a transposed convolution its last input step, the transformer its sliding window of keys and
values (its `DynamicCache` keeps `sliding_window - 1` of them): a `CodecStream`, as CSM's Mimi. Chunks decoded
this way join into the one-pass waveform up to float rounding, each costing only its own frames, where a
chunk decoded behind its whole receptive field as context (148 frames on the real checkpoint) costs those
again every time.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
    Qwen3OmniMoeCausalConvNet,
    Qwen3OmniMoeCausalTransConvNet,
    Qwen3OmniMoeCode2WavDecoderBlock,
    Qwen3OmniMoeCode2WavDecoderResidualUnit,
    Qwen3OmniMoeConvNeXtBlock,
    Qwen3OmniMoeSnakeBeta,
)

from omnistage.families.shared.codec_stream import CodecStream


def decode_stream(code2wav: Any, codes: torch.Tensor, state: CodecStream) -> torch.Tensor:
    """codes [1, 16, T] continuing `state`'s stream (new: `CodecStream(code2wav.config)`) → the waveform
    [1, 1, n] they complete: T × 1920 samples, the stream's first chunk `tail` fewer."""
    if codes.shape[1] != code2wav.config.num_quantizers:
        raise ValueError(f"expected {code2wav.config.num_quantizers} codebooks, got {codes.shape[1]}")
    hidden = code2wav.code_embedding(codes + code2wav.code_offset).mean(1)
    hidden = code2wav.pre_transformer(inputs_embeds=hidden, cache=state.cache, use_cache=True)
    hidden = hidden.last_hidden_state.permute(0, 2, 1)
    for blocks in code2wav.upsample:
        for block in blocks:
            hidden = _layer(block, hidden, state)
    for block in code2wav.decoder:
        hidden = _layer(block, hidden, state)
    return hidden.clamp(min=-1, max=1)


def _layer(layer: Any, x: torch.Tensor, state: CodecStream) -> torch.Tensor:
    """`layer`'s forward on the stream's next steps x [1, C, t]."""
    if isinstance(layer, Qwen3OmniMoeSnakeBeta):
        return layer(x)
    if isinstance(layer, Qwen3OmniMoeCausalConvNet):
        return _causal_conv(layer, x, state)
    if isinstance(layer, Qwen3OmniMoeCausalTransConvNet):
        return _trans_conv(layer, x, state)
    if isinstance(layer, Qwen3OmniMoeConvNeXtBlock):
        h = _causal_conv(layer.dwconv, x, state).permute(0, 2, 1)
        h = layer.gamma * layer.pwconv2(layer.act(layer.pwconv1(layer.norm(h))))
        return x + h.permute(0, 2, 1)
    if isinstance(layer, Qwen3OmniMoeCode2WavDecoderResidualUnit):
        return x + layer.conv2(layer.act2(_causal_conv(layer.conv1, layer.act1(x), state)))
    if isinstance(layer, Qwen3OmniMoeCode2WavDecoderBlock):
        for inner in layer.block:
            x = _layer(inner, x, state)
        return x
    raise TypeError(f"code2wav cannot stream through {type(layer).__name__}")


def _causal_conv(layer: Qwen3OmniMoeCausalConvNet, x: torch.Tensor, state: CodecStream) -> torch.Tensor:
    """The convolution over x behind the `padding` inputs it saw last (zeros at the stream's start, as the
    one-pass padding)."""
    if layer.stride != 1:
        raise ValueError("a strided causal convolution cannot stream")
    return layer.conv(state.carry(layer, x, layer.padding))


def _trans_conv(layer: Qwen3OmniMoeCausalTransConvNet, x: torch.Tensor, state: CodecStream) -> torch.Tensor:
    """Kernel = stride: each input step alone. Kernel 2s: the module's own forward (s samples cut at each end)
    over x behind the last step it saw, which completes that step's samples (none at the stream's start,
    as in one pass) and leaves x's last for the next chunk."""
    kernel, stride = layer.conv.kernel_size[0], layer.conv.stride[0]
    if kernel == stride:
        return layer(x)
    if kernel != 2 * stride:
        raise ValueError(f"a transposed convolution of kernel {kernel}, stride {stride} cannot stream")
    past = state.inputs.get(layer)
    if past is not None:
        x = torch.cat([past, x], dim=-1)
    state.inputs[layer] = x[..., -1:]
    return layer(x)
