"""Dia's decoder on the AR engine, every channel of a frame picked in the post-sample hook.

Dia is an encoder-decoder: a byte-level text encoder, then a decoder that attends the encoder's output and
writes a frame of C DAC codebooks ("channels") a step under a delay pattern (channel c runs `delay[c]`
steps behind channel 0). The checkpoint loads through transformers' own `DiaForConditionalGeneration`.
The text encoder runs once per request (`encode_text`, the input processor's); the engine keeps each
request's cross-attention K/V (`cross_kv`) and runs the decoder's layers packed (`PackedDiaDecoder`, as
`DiaDecoderLayer` computes them: RMS-normed self-attention with RoPE on the engine's paged cache, cross-
attention, SiLU-gated MLP). A decoder input is a frame's summed channel embeddings (`frame_embeds`).

The post-sample hook (`dia_frame`) picks the whole frame from the decoder's logits [C, V] as the reference's
`generate` does (its logits processors, in its order): classifier-free guidance (the request's decoder runs
beside a twin attending the encoder's output for an all-zero text, stages/ar/guidance.py; the logits become
cond + scale * (cond - uncond), and where the request has a top-k, the conditional logits within the top k of
those, as `DiaClassifierFreeGuidanceLogitsProcessor`), the EOS channel filter (only channel 0 may end, and
only where EOS is its top logit; no channel emits the special ids above EOS), temperature (a temperature
under 1 is clamped to 1, as `generate` does), top-k, top-p, then the delay pattern's EOS: once channel 0
ended (or the length limit came), channel c ends `delay[c]` steps later and pads after; the delay mask
(the processor's `decoder_input_ids`: BOS, or an audio prompt's delayed codes) overrides the first frames.
A request ends with its last channel's EOS (the step channel 0 ended is found in the sequence's history).
"""

from __future__ import annotations

import dataclasses
import json
import random
import types
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnistage.families.shared.depth_codes import SeededPick
from omnistage.stages.ar.attention import ATTENTION_NAME, METADATA_KWARG, paged_attention_forward
from omnistage.stages.ar.cross_attention import CROSS_KWARG, LayerKV, cross_attention
from omnistage.stages.ar.loader import LoadedModel, load_tokenizer
from omnistage.stages.ar.post_sample import PostSample, SampledStep


@dataclasses.dataclass
class DiaFrames:
    """A request's frame rules (on ARInputs.extension): the delay mask [M, C] (positions where it is not PAD
    are forced), the decoder prefix length, the frame budget (`generate`'s max_new_tokens: channel 0 ends
    `max(delay) + 1` frames before it) and the sampling spec (None: greedy)."""

    delay_mask: torch.Tensor
    prefix_len: int
    max_new: int
    spec: dict[str, Any] | None = None
    guidance_top_k: int | None = None  # CFG's top-k (the request's top_k, also when greedy), None: none


class FrameEmbedding(nn.Module):
    """ids [T] → [T, H]: the frame with every channel set to the id (the all-BOS start frame)."""

    def __init__(self, table: nn.Embedding, channels: int, vocab: int):
        super().__init__()
        self.table, self.channels, self.vocab = table, channels, vocab
        self.embedding_dim = table.embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids[:, None] + self.offsets(ids.device)).sum(dim=1)

    def offsets(self, device: Any) -> torch.Tensor:
        return torch.arange(self.channels, device=device) * self.vocab


class ChannelZeroHead(nn.Module):
    """The engine's head: channel 0's logits (what the engine samples is replaced by the hook's frame)."""

    def __init__(self, dense: nn.Linear, vocab: int):
        super().__init__()
        self.dense, self.vocab = dense, vocab

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.dense.weight[: self.vocab])


class PackedDiaDecoder(nn.Module):
    """`DiaDecoder`'s layers over the engine's packed rows: forward(inputs_embeds=[1, T, H],
    position_ids=[1, T], omni_attn=..., omni_cross=...)."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder
        attn = decoder.layers[0].self_attention
        self.heads, self.kv_heads, self.head_dim = attn.num_heads, attn.num_key_value_heads, attn.head_dim
        cross = decoder.layers[0].cross_attention
        self.cross_heads, self.cross_dim = cross.num_heads, cross.head_dim

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, **kwargs: Any) -> Any:
        from transformers.models.dia.modeling_dia import apply_rotary_pos_emb

        meta, cross = kwargs[METADATA_KWARG], kwargs[CROSS_KWARG]
        x = inputs_embeds[0]
        rows = x.shape[0]
        cos, sin = self.decoder.rotary_emb(x, position_ids=position_ids)
        for layer in self.decoder.layers:
            attn = layer.self_attention
            h = layer.pre_sa_norm(x)
            q = attn.q_proj(h).view(rows, self.heads, self.head_dim).transpose(0, 1)[None]
            k = attn.k_proj(h).view(rows, self.kv_heads, self.head_dim).transpose(0, 1)[None]
            v = attn.v_proj(h).view(rows, self.kv_heads, self.head_dim).transpose(0, 1)[None]
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            o, _ = paged_attention_forward(attn, q, k, v, None, scaling=1.0, **{METADATA_KWARG: meta})
            x = x + attn.o_proj(o.reshape(rows, -1))
            ca = layer.cross_attention
            h = layer.pre_ca_norm(x)
            q = ca.q_proj(h).view(rows, self.cross_heads, self.cross_dim)
            o = cross_attention(q, cross, ca.layer_idx, scale=1.0)
            x = x + ca.o_proj(o.reshape(rows, -1))
            x = x + layer.mlp(layer.pre_mlp_norm(x))
        return types.SimpleNamespace(last_hidden_state=self.decoder.norm(x)[None])


class _CrossProjection:
    """One encoder output [S, W] → each layer's cross-attention (key, value) as [heads, S, head_dim], the
    key/value heads repeated to the query heads (GQA)."""

    def __init__(self, decoder: nn.Module):
        self.layers = [layer.cross_attention for layer in decoder.layers]

    def __call__(self, states: torch.Tensor) -> LayerKV:
        out = []
        for attn in self.layers:
            shape = (states.shape[0], attn.num_key_value_heads, attn.head_dim)
            k = attn.k_proj(states).view(shape).transpose(0, 1)
            v = attn.v_proj(states).view(shape).transpose(0, 1)
            groups = attn.num_key_value_groups
            k, v = (t.repeat_interleave(groups, dim=0) if groups > 1 else t for t in (k, v))
            out.append((k.contiguous(), v.contiguous()))
        return out


@dataclasses.dataclass
class DiaDecoderModel(LoadedModel):
    """The AR engine's parts and what the input processor and the hook need."""

    encoder: nn.Module | None = None  # DiaEncoder: the request's text → encoder_hidden_states
    logits_dense: nn.Linear | None = None  # [H] → [C * V]
    frame_table: nn.Embedding | None = None  # [C * V, H]: every channel's ids, offset by channel
    delay_pattern: list[int] = dataclasses.field(default_factory=list)
    special: dict[str, int] = dataclasses.field(default_factory=dict)  # bos, eos, pad
    generation_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    text_tokenizer: Any = None  # DiaTokenizer (bytes, [S1]/[S2])
    model_dir: str = ""
    _codec: Any = (
        None  # DacModel (the encoder half used): an audio prompt's clip → codes, loaded on first use
    )
    _extractor: Any = None

    @property
    def channels(self) -> int:
        return len(self.delay_pattern)

    @property
    def vocab(self) -> int:
        return self.logits_dense.out_features // self.channels

    def frame_embeds(self, frames: torch.Tensor) -> torch.Tensor:
        """[N, C] ids → [N, H]: each frame's summed channel embeddings (the decoder's input)."""
        offsets = torch.arange(self.channels, device=frames.device) * self.vocab
        return self.frame_table(frames.to(self.frame_table.weight.device) + offsets).sum(dim=1)

    def clip_rate(self) -> int:
        """The sample rate an audio prompt is encoded at (the DAC's)."""
        from transformers import DacConfig

        from omnistage.families.dia.codec import codec_dir

        return int(DacConfig.from_pretrained(codec_dir(self.model_dir)).sampling_rate)

    @torch.inference_mode()
    def clip_codes(self, samples: Any) -> torch.Tensor:
        """An audio prompt (mono float samples at the DAC's rate) → its DAC codes [T, C], as the reference's
        processor encodes one clip: padded to whole hops by its feature extractor, then `DacModel.encode`."""
        import math

        from transformers import DiaFeatureExtractor

        from omnistage.families.dia.codec import load_dac

        if self._codec is None:
            device = self.logits_dense.weight.device
            self._codec = load_dac(self.model_dir, torch.float32, str(device))
            self._extractor = DiaFeatureExtractor.from_pretrained(self.model_dir)
        extractor = self._extractor
        features = extractor(
            samples, sampling_rate=extractor.sampling_rate, padding=True, return_tensors="pt"
        )
        hop = extractor.hop_length
        length = math.ceil(int(features["padding_mask"][0].sum()) / hop) * hop
        values = features["input_values"][0][None, ..., :length].to(self._codec.device)
        return self._codec.encode(values).audio_codes[0].T.to("cpu", torch.long)

    @torch.inference_mode()
    def encode_text(self, ids: list[int]) -> torch.Tensor:
        """The text encoder's output for one prompt [S, H_encoder]."""
        device = self.encoder.embedding.weight.device
        return self.encoder(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0]


@torch.inference_mode()
def load_decoder(model_dir: str, dtype: torch.dtype, device: str) -> DiaDecoderModel:
    """The AR engine's `model_loader` for a Dia checkpoint directory."""
    from transformers import DiaForConditionalGeneration

    model = DiaForConditionalGeneration.from_pretrained(
        model_dir,
        dtype=dtype,
        attn_implementation={"": "sdpa", "encoder_config": "sdpa", "decoder_config": ATTENTION_NAME},
    )
    model.to(device).eval()
    config = model.config
    dec = config.decoder_config
    decoder = model.model.decoder
    table = decoder.embeddings.embed
    return DiaDecoderModel(
        embed=FrameEmbedding(table, dec.num_channels, dec.vocab_size),
        decoder=PackedDiaDecoder(decoder),
        head=ChannelZeroHead(model.logits_dense, dec.vocab_size),
        config=dec,
        tokenizer=None,  # what the engine appends are channel-0 codes, not text
        eos_token_ids=[],  # the last channel's EOS ends a request (dia_frame), not one token
        root=model,
        cross_kv=_CrossProjection(decoder),
        encoder_hidden_size=config.encoder_config.hidden_size,  # Dia's encoder is narrower than its decoder
        encoder=model.model.encoder,
        logits_dense=model.logits_dense,
        frame_table=table,
        delay_pattern=list(config.delay_pattern),
        special={"bos": dec.bos_token_id, "eos": dec.eos_token_id, "pad": dec.pad_token_id},
        generation_config=_generation_config(model_dir),
        text_tokenizer=load_tokenizer(model_dir),
        model_dir=str(model_dir),
    )


def _generation_config(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / "generation_config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def sampling_spec(params: Any) -> dict[str, Any] | None:
    """A request's frame sampling: None (greedy) at temperature 0, else its temperature (clamped to 1 from
    below, as Dia's `generate` clamps it), top-k, top-p and seed (or a fresh one)."""
    temperature = getattr(params, "temperature", None)
    if temperature == 0.0:
        return None
    seed = getattr(params, "seed", None)
    return {
        "temperature": max(float(temperature if temperature is not None else 1.0), 1.0),
        "top_k": int(getattr(params, "top_k", 0) or 0),
        "top_p": float(getattr(params, "top_p", 1.0) or 1.0),
        "seed": int(seed) if seed is not None else random.getrandbits(62),
    }


def frame_rules(model: DiaDecoderModel, delay_mask: torch.Tensor, prefix_len: int, params: Any) -> DiaFrames:
    """The request's `DiaFrames` for a decoder prefix of `prefix_len` frames of `delay_mask` [M, C]."""
    max_new = int(getattr(params, "max_tokens", None) or 0)
    if max_new <= 0:
        raise ValueError("Dia requests need max_tokens (the reference's max_new_tokens)")
    top_k = int(getattr(params, "top_k", 0) or 0)
    return DiaFrames(
        delay_mask.to("cpu", torch.long),
        prefix_len,
        max_new,
        sampling_spec(params),
        top_k if top_k > 0 else None,
    )


def guide_logits(cond: torch.Tensor, uncond: torch.Tensor, scale: float, top_k: int | None) -> torch.Tensor:
    """`DiaClassifierFreeGuidanceLogitsProcessor` on one row's [C, V]: cond + scale * (cond - uncond), or with
    a top-k, the conditional logits where the guided ones are among their top k."""
    guided = cond + (cond - uncond) * scale
    if top_k is None:
        return guided
    keep = torch.zeros_like(guided, dtype=torch.bool).scatter(-1, guided.topk(top_k, dim=-1).indices, True)
    return cond.masked_fill(~keep, float("-inf"))


def _eos_filter(logits: torch.Tensor, eos: int) -> torch.Tensor:
    """`DiaEOSChannelFilterLogitsProcessor` on [S, C, V]."""
    logits = logits.clone()
    logits[:, 1:, eos:] = float("-inf")
    logits[:, 0, eos + 1 :] = float("-inf")
    top = logits.argmax(dim=-1)
    ends = top == eos
    keep_eos = torch.zeros_like(logits, dtype=torch.bool)
    keep_eos[..., :eos] = ends[..., None]
    logits = logits.masked_fill(keep_eos, float("-inf"))
    no_eos = torch.zeros_like(logits, dtype=torch.bool)
    no_eos[..., eos] = ~ends
    return logits.masked_fill(no_eos, float("-inf"))


def dia_frame(model: DiaDecoderModel, step: SampledStep) -> PostSample:
    """Post-sample hook: every channel of each sequence's next frame, its embedding (the next input), the
    token appended (channel 0's id) and the stop (the last channel's EOS)."""
    rows, channels, vocab = len(step.steps), model.channels, model.vocab
    eos, pad = model.special["eos"], model.special["pad"]
    dense = model.logits_dense
    logits = dense(step.hidden.to(dense.weight.dtype)).float().view(rows, channels, vocab)
    rules = [_rules(inputs) for inputs in step.inputs]
    if step.guide_hidden is not None:
        uncond = dense(step.guide_hidden.to(dense.weight.dtype)).float().view(rows, channels, vocab)
        for i, (inputs, r) in enumerate(zip(step.inputs, rules, strict=True)):
            if inputs.guidance is not None:
                logits[i] = guide_logits(logits[i], uncond[i], float(inputs.guidance.scale), r.guidance_top_k)
    logits = _eos_filter(logits, eos)
    specs = [r.spec for r in rules]
    if any(specs):
        pick = SeededPick(specs, step.steps, logits.device)
        frame = torch.stack([pick(c, logits[:, c]) for c in range(channels)], dim=1)
    else:
        frame = logits.argmax(dim=-1)
    delays = torch.tensor(model.delay_pattern, device=frame.device)
    stop = torch.zeros(rows, dtype=torch.bool, device=frame.device)
    for i, (k, r, past) in enumerate(zip(step.steps, rules, step.histories, strict=True)):
        # the step channel 0 ended: its EOS among the frames so far (what the engine appended is channel 0)
        eos_step = next((j for j, token in enumerate(past) if token == eos), None)
        if eos_step is None and (int(frame[i, 0]) == eos or k == r.max_new - max(model.delay_pattern) - 1):
            eos_step = k
        if eos_step is not None:
            since = k - eos_step  # the reference pads a channel after its EOS, forced `delay` steps late
            frame[i] = torch.where(delays == since, eos, torch.where(delays < since, pad, frame[i]))
            stop[i] = since >= max(model.delay_pattern)
        position = r.prefix_len + k
        if position < r.delay_mask.shape[0]:
            forced = r.delay_mask[position].to(frame.device)
            frame[i] = torch.where(forced != pad, forced, frame[i])
    return PostSample(next_embeds=model.frame_embeds(frame), stop=stop, frames=frame, token_ids=frame[:, 0])


def _rules(inputs: Any) -> DiaFrames:
    extension = getattr(inputs, "extension", None)
    if not isinstance(extension, DiaFrames):
        raise ValueError("a Dia request needs its DiaFrames (ARInputs.extension); see frame_rules")
    return extension


def delay_mask(model: DiaDecoderModel, codes: torch.Tensor | None = None) -> torch.Tensor:
    """The processor's `decoder_input_ids` for one request [M, C]: BOS then an audio prompt's codes
    ([T, C], undelayed; none for plain TTS), delayed by the pattern (BOS before a channel starts, PAD past
    its end), as `DiaProcessor.__call__` builds it."""
    from transformers import DiaProcessor

    channels, max_delay = model.channels, max(model.delay_pattern)
    frames = 0 if codes is None else codes.shape[0]
    prefill = torch.full((1, frames + 1 + max_delay, channels), model.special["pad"], dtype=torch.long)
    prefill[0, 0] = model.special["bos"]
    if codes is not None:
        prefill[0, 1 : frames + 1] = codes.to("cpu", torch.long)
    index = DiaProcessor.build_indices(1, prefill.shape[1], channels, model.delay_pattern, revert=False)
    return DiaProcessor.apply_audio_delay(prefill, model.special["pad"], model.special["bos"], index)[0]


def default_guidance(model: DiaDecoderModel) -> float:
    """The checkpoint's guidance scale (Dia-1.6B's generation_config: 3.0), what its `generate` uses."""
    return float(model.generation_config.get("guidance_scale") or 1.0)


@torch.inference_mode()
def decoder_prompt(
    model: DiaDecoderModel,
    text: str,
    params: Any,
    codes: torch.Tensor | None = None,
    guidance_scale: float | None = None,
) -> tuple[list[int], Any]:
    """The decoder's prompt for `text` (after an audio prompt's DAC codes [T, C], if any): channel 0's ids of
    the prefix frames (BOS, then the prompt), and ARInputs with their frame embeddings, the text encoder's
    output, the request's `DiaFrames` and, for a guidance scale other than 1 (None: the checkpoint's), the
    unconditional twin's encoder output (the encoder on as many zero ids as the text has, as `generate`
    makes it)."""
    from omnistage.stages.ar.ar_inputs import ARInputs
    from omnistage.stages.ar.guidance import Guidance

    if int(getattr(params, "n", 1) or 1) != 1:
        raise ValueError("Dia makes one sequence a request (its generate rejects num_return_sequences > 1)")
    mask = delay_mask(model, codes)
    prefix = mask.shape[0] - int((mask[:, 0] == model.special["pad"]).sum())
    scale = default_guidance(model) if guidance_scale is None else float(guidance_scale)
    if scale < 1.0:
        raise ValueError("guidance_scale: Dia's guidance takes a scale of at least 1 (1: off)")
    ids = model.text_tokenizer(text, add_special_tokens=False)["input_ids"]
    guidance = None
    if scale != 1.0:
        guidance = Guidance(scale, encoder_hidden_states=model.encode_text([0] * len(ids)))
    inputs = ARInputs(
        inputs_embeds=model.frame_embeds(mask[:prefix]),
        encoder_hidden_states=model.encode_text(ids),
        extension=frame_rules(model, mask, prefix, params),
        guidance=guidance,
    )
    return mask[:prefix, 0].tolist(), inputs
