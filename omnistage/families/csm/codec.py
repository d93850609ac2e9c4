"""The codec stage: CSM's Mimi decoder behind the generation engine.

Frames in are the backbone's [T, K] codes (real frames only: the input processor drops the all-EOS one);
audio out is 1920 samples a frame at 24 kHz (12.5 Hz). Full handoff decodes each request in one pass exactly
as the reference (`codec_model.decode`). Async chunk, by default, decodes each request as a stream: each
chunk once, continuing the state the request's earlier chunks left (`CodecStream`), so the chunks cost only
their own frames and join into the one-pass waveform. That works because every layer of Mimi's decoder is
causal: RVQ dequantizer → transposed conv to 25 Hz → sliding-window transformer → SEANet (causal convs,
transposed-conv upsamplers, residual blocks). Each layer runs with its own module's weights; a stream only
supplies what the layer would read again of the frames it saw before.

Only the codec is loaded (`load_mimi`), not the backbone: the released checkpoint's text embedding alone is
1 GB.
"""

from __future__ import annotations

import json
import math
from collections.abc import Generator as Steps
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from omnistage.families.shared.codec_stage import CodecArgs, codec_engine
from omnistage.families.shared.codec_stream import CodecStream
from omnistage.stages.ar.loader import resolve_dtype
from omnistage.stages.base import EngineContext
from omnistage.stages.generation.engine import (
    GenerationBatch,
    GenerationEngine,
    WindowDone,
    generate_by_window,
)

PREFIX = "codec_model."
# The checkpoint keeps Mimi's flat layout, `MimiModel` nests its decoder half under `decoder.` (transformers'
# conversion_mapping, "MimiModel"); keys already nested are left as they are.
RENAMES = (
    ("upsample.", "decoder.upsample."),
    ("decoder_transformer.", "decoder.decoder_transformer."),
    ("decoder.layers.", "decoder.decoder_seanet.layers."),
)
ENCODER = ("encoder.", "encoder_transformer.", "downsample.")  # the encoder half: not loaded


def load_mimi(model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Any:
    """`CsmForConditionalGeneration`'s `codec_model` without its encoder (a `transformers.MimiModel`): its
    quantizer and decoder weights read from the checkpoint alone, every one of them required."""
    from safetensors import safe_open
    from transformers import CsmConfig, MimiModel
    from transformers.initialization import no_init_weights

    config = CsmConfig.from_pretrained(str(model_dir)).codec_config
    config.encoder_config = None  # decoding only
    with no_init_weights():  # every weight is loaded next
        model = MimiModel(config)
    state = {}
    for path, keys in _codec_files(Path(model_dir)).items():
        with safe_open(str(path), "pt") as f:
            for key in keys:
                name = _renamed(key.removeprefix(PREFIX))
                if not name.startswith(ENCODER):
                    state[name] = f.get_tensor(key)
    model.load_state_dict(state, strict=True)
    return model.to(device, dtype).eval()


def _codec_files(model_dir: Path) -> dict[Path, list[str]]:
    """The codec's checkpoint keys, by the safetensors file holding them (one file, or an index's shards)."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files: dict[Path, list[str]] = {}
        for key, name in json.loads(index.read_text())["weight_map"].items():
            if key.startswith(PREFIX):
                files.setdefault(model_dir / name, []).append(key)
        return files
    from safetensors import safe_open

    path = model_dir / "model.safetensors"
    with safe_open(str(path), "pt") as f:
        return {path: [key for key in f.keys() if key.startswith(PREFIX)]}  # noqa: SIM118 - not iterable


def _renamed(key: str) -> str:
    for old, new in RENAMES:
        if key.startswith(old):
            return new + key.removeprefix(old)
    return key


def stream_decode(codec: Any, codes: torch.Tensor, stream: CodecStream) -> torch.Tensor:
    """codes [1, K, T] → waveform [1, 1, T * samples_per_frame]: `codec.decode` of the stream's frames so far
    and these, cut to these frames' samples, computing only these frames."""
    decoder = codec.decoder
    h = codec.quantizer.decode(codes)
    if decoder.upsample is not None:
        h = _transposed(decoder.upsample, h, stream)
    h = decoder.decoder_transformer(h.transpose(1, 2), cache=stream.cache).last_hidden_state.transpose(1, 2)
    for layer in decoder.decoder_seanet.layers:
        h = _layer(layer, h, stream)
    return h


def _layer(layer: nn.Module, x: torch.Tensor, stream: CodecStream) -> torch.Tensor:
    """A SEANet layer continuing `stream`; activations carry nothing."""
    from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d, MimiResnetBlock

    if isinstance(layer, MimiConv1d):
        return _conv(layer, x, stream)
    if isinstance(layer, MimiConvTranspose1d):
        return _transposed(layer, x, stream)
    if isinstance(layer, MimiResnetBlock):
        h = x
        for sub in layer.block:
            h = _layer(sub, h, stream)
        return _layer(layer.shortcut, x, stream) + h
    return layer(x)


def _conv(layer: Any, x: torch.Tensor, stream: CodecStream) -> torch.Tensor:
    """`MimiConv1d`: a causal stride-1 conv pads `kernel - 1` inputs on the left (its extra right padding,
    for strided convs, is 0 at stride 1); in a stream those are the inputs it saw last."""
    conv = layer.conv
    if not layer.causal or conv.stride[0] != 1:
        raise ValueError(f"a {'strided' if layer.causal else 'non-causal'} Mimi conv cannot stream")
    if layer.pad_mode not in ("constant", "replicate"):
        raise ValueError(f"a Mimi conv padding by {layer.pad_mode!r} cannot stream")
    width = (conv.kernel_size[0] - 1) * conv.dilation[0]
    return conv(stream.carry(layer, x, width, replicate=layer.pad_mode == "replicate"))


def _transposed(layer: Any, x: torch.Tensor, stream: CodecStream) -> torch.Tensor:
    """`MimiConvTranspose1d` (causal: its `kernel - stride` overlap trimmed on the right). Input frame t's
    `stride` outputs are the sum, over its `taps = ceil(kernel / stride)` strides of the kernel, of tap j
    applied to frame t - j: so a stream carries the last `taps - 1` input frames (zeros at its start: a zero
    frame adds nothing). Computed as one matmul with the conv's weights and that sum: oneDNN's transposed
    conv (the one-pass path's) builds a kernel for each new input length, up to seconds on a CPU for some
    lengths, which chunks of ever new lengths would keep paying."""
    conv = layer.conv
    if layer.padding_left:
        raise ValueError("a Mimi transposed conv trimmed on the left cannot stream")
    kernel, stride, groups = conv.kernel_size[0], conv.stride[0], conv.groups
    taps, frames = math.ceil(kernel / stride), x.shape[-1]
    joined = stream.carry(layer, x, taps - 1)
    batch, cin, length = joined.shape
    weight = F.pad(conv.weight, (0, taps * stride - kernel)).view(groups, cin // groups, -1, taps * stride)
    cols = torch.einsum("giok,bgit->bgokt", weight, joined.view(batch, groups, cin // groups, length))
    cols = cols.reshape(batch, -1, taps, stride, length)  # [B, Cout, tap, stride, frame]
    out = sum(cols[:, :, j, :, taps - 1 - j : taps - 1 - j + frames] for j in range(taps))
    out = out.transpose(2, 3).reshape(batch, -1, frames * stride)
    return out if conv.bias is None else out + conv.bias[:, None]


def samples_per_frame(codec: Any) -> int:
    """Output samples a code frame: the decoder's upsampling strides."""
    from transformers.models.mimi.modeling_mimi import MimiConvTranspose1d

    decoder = codec.decoder
    layers = [decoder.upsample, *decoder.decoder_seanet.layers]
    return math.prod(layer.conv.stride[0] for layer in layers if isinstance(layer, MimiConvTranspose1d))


def context_frames(codec: Any) -> int:
    """How many earlier frames a frame's samples can depend on (the decoder's receptive field, in frames): a
    chunk decoded with this much left context equals the one-pass decode. Each layer reaches back, at its own
    rate: the transposed convs `ceil(kernel / stride) - 1` input steps, the transformer `sliding_window - 1`
    steps per layer (at 25 Hz, 2 steps a frame), each causal conv `(kernel - 1) * dilation` steps. The
    transformer dominates: 2 layers x 249 steps = 249 frames for the tiny codec (254 in all), 8 x 249 = 996
    for csm-1b's."""
    from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiConvTranspose1d

    decoder, back, per = codec.decoder, 0.0, 1  # look-back in frames; steps a frame at the current rate

    def reach(layer: Any) -> float:
        nonlocal per
        conv = layer.conv
        if isinstance(layer, MimiConvTranspose1d):
            steps = math.ceil(conv.kernel_size[0] / conv.stride[0]) - 1
            steps, per = steps / per, per * conv.stride[0]
            return steps
        return (conv.kernel_size[0] - 1) * conv.dilation[0] / per

    if decoder.upsample is not None:
        back += reach(decoder.upsample)
    config = decoder.decoder_transformer.config
    back += config.num_hidden_layers * (config.sliding_window - 1) / per
    for layer in decoder.decoder_seanet.modules():
        if isinstance(layer, MimiConv1d | MimiConvTranspose1d):
            back += reach(layer)
    return math.ceil(back)


class CsmCodecGenerator:
    """`generate(windows, params[, stream_ids])`: one waveform [T * 1920] per [T, K] code window; with stream
    ids, each window continues its stream (the engine's `streams`)."""

    def __init__(self, codec: Any):
        self.codec = codec
        self.sample_rate = int(codec.config.sampling_rate)
        self.outputs_per_frame = samples_per_frame(codec)
        self.streams: dict[str, CodecStream] = {}

    def run(self, batch: GenerationBatch) -> Steps[WindowDone, None, list[torch.Tensor]]:
        """A window a unit, each sent as soon as it is decoded."""
        return generate_by_window(self.generate, batch)

    def generate(
        self, windows: list[torch.Tensor], params: list[Any], stream_ids: list[str] | None = None
    ) -> list[torch.Tensor]:
        device = next(self.codec.parameters()).device
        out = []
        with torch.inference_mode():
            for i, window in enumerate(windows):
                if window.shape[0] == 0:
                    out.append(torch.empty(0))
                    continue
                codes = window.to(device, torch.long).T[None]  # [1, K, T]
                if stream_ids is None:
                    wave = self.codec.decode(codes).audio_values
                else:
                    stream = self.streams.get(stream_ids[i])
                    if stream is None:
                        config = self.codec.decoder.decoder_transformer.config
                        stream = self.streams[stream_ids[i]] = CodecStream(config)
                    wave = stream_decode(self.codec, codes, stream)
                out.append(wave[0, 0].float().cpu())
        return out

    def end_stream(self, stream_id: str) -> None:
        self.streams.pop(stream_id, None)


def create_engine(ctx: EngineContext) -> GenerationEngine:
    """engine_args: `CodecArgs` (codec_engine says what each does; `left_context_frames: "exact"` is
    `context_frames`, the decoder's receptive field). `async_chunk: false` decodes each request in one pass,
    exactly as the reference. The deployment's `dtype` ("auto": the checkpoint's) is the codec's."""
    from transformers import CsmConfig

    dtype = resolve_dtype(ctx.deploy.dtype, ctx.model_dir, ctx.device)
    codec = load_mimi(ctx.model_dir, dtype, ctx.device)
    generator = CsmCodecGenerator(codec)
    # the input processors cut a request's frames at its all-EOS frame (pipeline.py)
    generator.codebook_eos_token_id = CsmConfig.from_pretrained(ctx.model_dir).codebook_eos_token_id
    return codec_engine(ctx, generator, context_frames(codec))


create_engine.args_type = CodecArgs
