"""Whisper's decoder on the AR engine: the transformers layers' own weights, evaluated packed.

The engine calls `forward(inputs_embeds=[1, T, H], position_ids=[1, T], omni_attn=..., omni_cross=...)`
on every scheduled row at once. Per layer, as `WhisperDecoderLayer` does: pre-norm self-attention (the
engine's paged attention; q scaled before the product, as transformers keeps it), pre-norm
cross-attention to each sequence's own encoder keys (projected once per request by `cross_kv`), pre-norm
GELU MLP; then the final norm. Learned positions are added to the token embeddings first.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from omnistage.stages.ar.attention import ATTENTION_NAME, METADATA_KWARG, paged_attention_forward
from omnistage.stages.ar.cross_attention import CROSS_KWARG, LayerKV, cross_attention
from omnistage.stages.ar.loader import LoadedModel, eos_token_ids, load_tokenizer


class PackedWhisperDecoder(nn.Module):
    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder
        self.heads = decoder.layers[0].self_attn.num_heads
        self.head_dim = decoder.layers[0].self_attn.head_dim

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, **kwargs: Any) -> Any:
        meta, cross = kwargs[METADATA_KWARG], kwargs[CROSS_KWARG]
        x = inputs_embeds[0] + self.decoder.embed_positions.weight[position_ids[0]]
        rows = x.shape[0]
        for layer in self.decoder.layers:
            attn = layer.self_attn
            h = layer.self_attn_layer_norm(x)
            q = (attn.q_proj(h) * attn.scaling).view(rows, self.heads, self.head_dim)
            k = attn.k_proj(h).view(rows, self.heads, self.head_dim)
            v = attn.v_proj(h).view(rows, self.heads, self.head_dim)
            o, _ = paged_attention_forward(
                attn,
                *(t.transpose(0, 1)[None] for t in (q, k, v)),
                None,
                scaling=1.0,
                **{METADATA_KWARG: meta},
            )
            x = x + attn.out_proj(o.reshape(rows, -1))
            attn = layer.encoder_attn
            h = layer.encoder_attn_layer_norm(x)
            q = (attn.q_proj(h) * attn.scaling).view(rows, self.heads, self.head_dim)
            o = cross_attention(q, cross, attn.layer_idx, scale=1.0)
            x = x + attn.out_proj(o.reshape(rows, -1))
            h = layer.final_layer_norm(x)
            x = x + layer.fc2(layer.activation_fn(layer.fc1(h)))
        return types.SimpleNamespace(last_hidden_state=self.decoder.layer_norm(x)[None])


class _CrossProjection:
    """One encoder output [S, H] → each layer's cross-attention (key, value) as [heads, S, head_dim]."""

    def __init__(self, decoder: nn.Module):
        self.layers = [layer.encoder_attn for layer in decoder.layers]

    def __call__(self, states: torch.Tensor) -> LayerKV:
        out = []
        for attn in self.layers:
            k = attn.k_proj(states).view(states.shape[0], attn.num_heads, attn.head_dim).transpose(0, 1)
            v = attn.v_proj(states).view(states.shape[0], attn.num_heads, attn.head_dim).transpose(0, 1)
            out.append((k.contiguous(), v.contiguous()))
        return out


def load_decoder(model_dir: str, dtype: torch.dtype, device: str) -> LoadedModel:
    """The AR engine's model_loader for a Whisper directory: the decoder only (the encoder is dropped)."""
    from transformers import GenerationConfig, WhisperForConditionalGeneration

    from omnistage.families.whisper.decoding import SuppressTokens

    model = WhisperForConditionalGeneration.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="sdpa"
    )
    model.model.encoder = None
    model.to(device).eval()
    config, decoder = model.config, model.model.decoder
    gen = GenerationConfig.from_pretrained(model_dir)
    text_config = types.SimpleNamespace(
        num_hidden_layers=config.decoder_layers,
        num_attention_heads=config.decoder_attention_heads,
        num_key_value_heads=config.decoder_attention_heads,
        hidden_size=config.d_model,
        head_dim=config.d_model // config.decoder_attention_heads,
        max_position_embeddings=config.max_target_positions,
        vocab_size=config.vocab_size,
        pad_token_id=config.pad_token_id,
        _attn_implementation=ATTENTION_NAME,
    )
    loaded = LoadedModel(
        embed=decoder.embed_tokens,  # (WhisperDecoder never applies its embed_scale)
        decoder=PackedWhisperDecoder(decoder),
        head=model.proj_out,
        config=text_config,
        tokenizer=load_tokenizer(model_dir),
        eos_token_ids=eos_token_ids(model_dir, config),
        root=model,
        cross_kv=_CrossProjection(decoder),
        logits_processors=[SuppressTokens(gen.suppress_tokens or [], gen.begin_suppress_tokens or [])],
    )
    # What the decoder's input processor reads (StageInputContext.resources).
    loaded.generation_config = gen
    loaded.encoder_positions = config.max_source_positions
    return loaded
