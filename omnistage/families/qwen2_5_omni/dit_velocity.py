"""The code2wav DiT's velocity field for one ODE solve, with what does not change during the solve computed
once.

transformers' `Qwen2_5OmniToken2WavDiTModel.forward` is evaluated 36 times a solve (9 RK4 steps of 4), and
each time it re-embeds the codes, re-encodes the speaker's reference mel, rebuilds rotary tables and the block
mask, and recomputes every layer's time modulation — none of which depends on the ODE state. At async-chunk
window sizes the model is so small that this, and the Python around ~60 small ops a layer, is most of the
cost. `DiTVelocity` keeps the reference's arithmetic with those parts hoisted:

- per solve: code embeddings (conditional and dropped), the speaker encoding, the input projection of
  everything but the state (the projection is linear, so it splits into a state part and a constant part),
  rotary tables and each layer's key span per block;
- per ODE time (the solver's times are the same for every solve): the time embedding and every layer's
  modulation vectors;
- per layer: one fused q/k/v projection whose head-0 rows are stored de-interleaved, so the rotary embedding
  (the reference rotates head 0 only, after de-interleaving it) needs no reordering;
- attention block by block over each block's allowed keys: the reference's block-banded mask gives masked
  keys exactly zero weight, so attending to the allowed span only is the same math, at a cost linear in the
  length instead of quadratic (transformers runs it as dense masked attention).

Outputs equal the model's forward to float rounding (~1.5e-6 on values of ~4; tested directly, and through
whole decodes against transformers' token2wav).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import rotate_half

# Per layer (shift, 1 + scale, gate) for attention then MLP; the output norm's 1 + scale and shift.
TimeModulation = tuple[list[tuple[torch.Tensor, ...]], torch.Tensor, torch.Tensor]


@dataclasses.dataclass
class SolveConstants:
    """What one solve's evaluations share (solves may interleave: the engine pauses them between steps)."""

    constant: torch.Tensor  # [rows, T, hidden] the input projection of everything but the state
    cos: torch.Tensor  # [rows, 1, T, head_dim] rotary tables
    sin: torch.Tensor
    spans: dict[tuple[int, int], list[tuple[int, int, int, int]]]  # per (back, ahead): block, key span

    @property
    def rows(self) -> int:
        return self.constant.shape[0]


class DiTVelocity:
    """`prepare(...)` once per solve, then call the result with `(x, t)` for the model output ([2B, T, mel]
    with guidance, the conditional half first; [B, T, mel] without)."""

    TIME_CACHE = 512  # (time, rows) entries kept; a solve uses 36 times

    def __init__(self, dit: Any):
        self.dit = dit
        self.heads = int(dit.num_attention_heads)
        self.block = int(dit.block_size)
        self.layers = []
        for layer in dit.transformer_blocks:
            attn = layer.attn
            width = attn.to_q.weight.shape[0]
            head_dim = width // self.heads
            order = torch.arange(width)
            order[:head_dim] = torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])
            weight = torch.cat([attn.to_q.weight[order], attn.to_k.weight[order], attn.to_v.weight])
            bias = torch.cat([attn.to_q.bias[order], attn.to_k.bias[order], attn.to_v.bias])
            reach = (int(layer.look_backward_block), int(layer.look_ahead_block))
            self.layers.append((layer, weight.detach().contiguous(), bias.detach().contiguous(), reach))
        self.head_dim = self.layers[0][1].shape[0] // 3 // self.heads
        proj = dit.input_embed.proj
        self.state_weight = proj.weight[:, : dit.mel_dim].detach().contiguous()
        self._times: dict[tuple[float, int], TimeModulation] = {}

    def prepare(
        self, ref_mel: torch.Tensor, speaker: torch.Tensor, codes: torch.Tensor, guidance: bool
    ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """Constants of one solve: `ref_mel` [B, T_ref, mel], `speaker` [B, T, enc], `codes` [B, codes]."""
        dit = self.dit
        frames = speaker.shape[1]
        code_embed = dit.text_embed(codes, drop_code=False)
        if guidance:
            speaker = torch.cat([speaker, torch.zeros_like(speaker)])
            ref_mel = torch.cat([ref_mel, torch.zeros_like(ref_mel)])
            code_embed = torch.cat([code_embed, dit.text_embed(codes, drop_code=True)])
        voice = dit.input_embed.spk_encoder(ref_mel).unsqueeze(1).repeat(1, frames, 1)
        proj = dit.input_embed.proj
        rest = torch.cat((voice, code_embed, speaker), dim=-1)
        constant = F.linear(rest, proj.weight[:, dit.mel_dim :], proj.bias)
        positions = torch.arange(frames, device=codes.device)[None].repeat(constant.shape[0], 1)
        cos, sin = dit.rotary_embed(constant, positions)
        blocks = -(-frames // self.block)
        spans = {}
        for _, _, _, (back, ahead) in self.layers:
            spans[(back, ahead)] = [
                (
                    b * self.block,
                    min((b + 1) * self.block, frames),
                    max(0, b - back) * self.block,
                    min(blocks, b + ahead + 1) * self.block,
                )
                for b in range(blocks)
            ]
        return functools.partial(
            self._evaluate, SolveConstants(constant, cos.unsqueeze(1), sin.unsqueeze(1), spans)
        )

    def _time(self, t: torch.Tensor, rows: int) -> TimeModulation:
        """The time embedding's modulations for every layer and the output norm, at ODE time `t`."""
        key = (float(t), rows)
        cached = self._times.get(key)
        if cached is None:
            if len(self._times) >= self.TIME_CACHE:
                self._times.clear()
            emb = F.silu(self.dit.time_embed(t.reshape(1).repeat(rows)))
            layers = []
            for layer, _, _, _ in self.layers:
                mods = torch.chunk(layer.attn_norm.linear(emb), 6, dim=1)
                shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = (m[:, None] for m in mods)
                layers.append((shift_a, 1 + scale_a, gate_a, shift_f, 1 + scale_f, gate_f))
            scale, shift = torch.chunk(self.dit.norm_out.linear(emb), 2, dim=1)
            cached = self._times[key] = (layers, 1 + scale[:, None], shift[:, None])
        return cached

    def _evaluate(self, c: SolveConstants, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        layers, out_scale, out_shift = self._time(t, c.rows)
        state = torch.cat([x, x]) if c.rows == 2 * x.shape[0] else x
        h = F.linear(state, self.state_weight) + c.constant
        rows, frames, width = h.shape
        for (layer, weight, bias, reach), (shift_a, scale_a, gate_a, shift_f, scale_f, gate_f) in zip(
            self.layers, layers, strict=True
        ):
            normed = F.layer_norm(h, (width,), eps=1e-6) * scale_a + shift_a
            qkv = F.linear(normed, weight, bias).view(rows, frames, 3, self.heads, self.head_dim)
            q, k, v = (part.transpose(1, 2) for part in qkv.unbind(2))
            q = torch.cat([q[:, :1] * c.cos + rotate_half(q[:, :1]) * c.sin, q[:, 1:]], dim=1)
            k = torch.cat([k[:, :1] * c.cos + rotate_half(k[:, :1]) * c.sin, k[:, 1:]], dim=1)
            attended = q.new_empty(rows, frames, self.heads, self.head_dim)
            for start, stop, lo, hi in c.spans[reach]:
                attended[:, start:stop] = F.scaled_dot_product_attention(
                    q[:, :, start:stop], k[:, :, lo:hi], v[:, :, lo:hi]
                ).transpose(1, 2)
            h = h + gate_a * layer.attn.to_out[0](attended.reshape(rows, frames, width))
            normed = F.layer_norm(h, (width,), eps=1e-6) * scale_f + shift_f
            mlp = layer.ff.ff  # Linear, GELU, Dropout (inactive in eval), Linear
            h = h + gate_f * mlp[3](mlp[1](mlp[0](normed)))
        h = F.layer_norm(h, (width,), eps=1e-6) * out_scale + out_shift
        return self.dit.proj_out(h)
