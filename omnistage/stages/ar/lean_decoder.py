"""The decoder stack of Llama/Qwen2-family models, evaluated without transformers' per-call machinery.

At decode batch sizes a small model's step pays for Python around its tensor ops: the decorated `forward`
of the model (output capture, config defaults, deprecation shims, causal-mask dispatch), then per layer six
module calls and their hooks, and one GEMM call per linear. `LeanDecoder` runs the same tensor ops, in the
same order, on the same weights (packed ones where the engine packed them; q/k/v and gate/up as one packed
GEMM each, which is bit-identical) and with the same paged attention function, so its outputs equal the
model's forward (tested bit for bit). On the Qwen2.5-Omni benchmark talker (4 layers of width 256, 8
sequences) a decode step takes 7.6 ms this way against 8.1-8.9 ms through the model's forward.

Only layer types whose arithmetic is known are run this way (`supports`); anything else keeps the model's
own forward.

Where the native kernels are built (native.py: AVX-512 CPUs) and every joint GEMM is packed, each layer's
pointwise work runs as four native calls instead of some thirty torch ops: RMS norm fused with the residual
add before it, rotary embedding in place on the q/k/v GEMM's output, and SiLU-times-up. Rotary is
bit-identical there; the norms sum their squares in another order, and float32 SiLU uses another e^x, so
hidden states differ from the model's forward by float rounding (bf16 ones almost never), and greedy tokens
equal transformers' (tested). `native_ops = None` keeps the torch ops.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from omnistage.stages.ar import native
from omnistage.stages.ar.attention import paged_attention_forward
from omnistage.stages.ar.packed_linear import Joint, JointLinear, fuse_packed

# (decoder layer, attention, RMS norm) classes whose forward is: pre-norm attention with rotary q/k, a
# residual, pre-norm gated MLP, a residual; RMS norm = weight * x * rsqrt(mean(x²) + eps).
KNOWN_LAYERS = {
    "Qwen2_5OmniDecoderLayer": ("Qwen2_5OmniAttention", "Qwen2_5OmniRMSNorm"),
    "Qwen2DecoderLayer": ("Qwen2Attention", "Qwen2RMSNorm"),
    "LlamaDecoderLayer": ("LlamaAttention", "LlamaRMSNorm"),
}


def lean_decoder(decoder: Any) -> Any:
    """What the engine should call for `decoder`: its lean form when it has one, else the decoder itself. A
    wrapper offers its own through `lean_decoder()` (e.g. one that projects its inputs first)."""
    own = getattr(decoder, "lean_decoder", None)
    made = own() if callable(own) else (LeanDecoder(decoder) if supports(decoder) else None)
    return made or decoder


def supports(model: Any) -> bool:
    """A decoder (`layers`, `norm`, `rotary_emb`) of known layers only, full attention, SiLU MLPs."""
    return unsupported(model) is None


def unsupported(model: Any) -> str | None:
    """Why the lean stack cannot run `model` (None: it can), for the log line that names the engine's path."""
    layers = getattr(model, "layers", None)
    if layers is None or not hasattr(model, "norm") or not hasattr(model, "rotary_emb"):
        return f"{type(model).__name__} has no layers/norm/rotary_emb"
    for layer in layers:
        name = type(layer).__name__
        known = KNOWN_LAYERS.get(name)
        if known is None:
            return f"{name} is not a known layer type"
        attn, mlp = layer.self_attn, layer.mlp
        if type(attn).__name__ != known[0] or getattr(attn, "sliding_window", None) is not None:
            return f"{name}: attention {type(attn).__name__} (or a sliding window)"
        norms = (layer.input_layernorm, layer.post_attention_layernorm, model.norm)
        if any(type(n).__name__ != known[1] for n in norms):
            return f"{name}: norms other than {known[1]}"
        act = getattr(mlp, "act_fn", None)
        if not isinstance(act, torch.nn.SiLU) and type(act).__name__ != "SiLUActivation":
            return f"{name}: MLP {type(mlp).__name__} is not a SiLU-gated MLP"
    return None


def describe(made: Any, decoder: Any) -> str:
    """What the engine runs for `decoder` (`made` = `lean_decoder(decoder)`), and why, in words."""
    if isinstance(made, LeanDecoder):
        kinds = sorted({type(layer).__name__ for layer in made.model.layers})
        ops = "native kernels" if made.native_ops is not None else f"torch ops ({made.native_reason})"
        path = f"lean decoder over {len(made.layers)} {'/'.join(kinds)} layers, pointwise on {ops}"
    elif made is not decoder:
        path = f"the family's own lean decoder {type(made).__name__}"
    else:
        path = f"the model's own forward (no lean decoder: {unsupported(decoder)})"
    attention = "native paged decode and cache write" if native.kernels() is not None else "torch SDPA"
    return f"{path}; attention: {attention}"


class LeanDecoder:
    """Called as the model is by the engine: `(inputs_embeds=[1, T, H], position_ids=..., **kwargs)` →
    an object with `.last_hidden_state`. `input_proj` (optional) maps the inputs first."""

    def __init__(self, model: Any, input_proj: torch.nn.Module | None = None):
        self.model = model
        self.input_proj = input_proj
        self.layers = [
            (
                layer.input_layernorm,
                layer.self_attn,
                layer.post_attention_layernorm,
                layer.mlp,
                int(layer.self_attn.head_dim),
                _joint(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
                _joint(layer.mlp.gate_proj, layer.mlp.up_proj),
            )
            for layer in model.layers
        ]
        self.norms = [layer.input_layernorm for layer in model.layers] + [model.norm]
        self.native_reason = self._native_reason()
        self.native_ops = native.kernels() if self.native_reason is None else None

    def _native_reason(self) -> str | None:
        """Why the native kernels do not apply to every layer (None: they do). They need to be built here,
        packed joint GEMMs, and norm weights of one float32/bf16 dtype on the CPU."""
        weights = [n.weight for n in self.norms] + [layer[2].weight for layer in self.layers]
        dtypes = {w.dtype for w in weights}
        joints = [j for layer in self.layers for j in layer[5:7]]
        if native.kernels() is None:
            return "the native kernels are not built here"
        if len(dtypes) != 1 or next(iter(dtypes)) not in native.DTYPES:
            return f"norm weights of dtype {sorted(map(str, dtypes))}"
        if not all(w.device.type == "cpu" for w in weights):
            return "weights off the CPU"
        if not all(isinstance(j, JointLinear) for j in joints):
            return "linears not packed"
        return None

    def __call__(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        hidden_layers: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> types.SimpleNamespace:
        """`hidden_layers`: transformers' `hidden_states` indices below the last (0: the decoder's input,
        k: layer k-1's output) to record in `.hidden_states`, a dict by index."""
        kwargs.pop("attention_mask", None)
        kwargs.pop("use_cache", None)
        h = inputs_embeds if self.input_proj is None else self.input_proj(inputs_embeds)
        cos, sin = self.model.rotary_emb(h, position_ids)
        seen: dict[int, torch.Tensor] = {}
        if self.native_ops is not None and h.dtype == self.norms[0].weight.dtype:
            last = self._native_forward(h, cos, sin, kwargs, hidden_layers, seen)
            return types.SimpleNamespace(last_hidden_state=last, hidden_states=seen)
        batch, length, _ = h.shape
        for i, (norm_in, attn, norm_post, mlp, head_dim, qkv, gate_up) in enumerate(self.layers):
            if hidden_layers and i in hidden_layers:
                seen[i] = h
            x = norm_in.forward(h)
            q, k, v = (part.view(batch, length, -1, head_dim).transpose(1, 2) for part in qkv(x))
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            out, _ = paged_attention_forward(attn, q, k, v, None, scaling=attn.scaling, **kwargs)
            h = h + attn.o_proj.forward(out.reshape(batch, length, -1).contiguous())
            x = norm_post.forward(h)
            gate, up = gate_up(x)
            h = h + mlp.down_proj.forward(F.silu(gate) * up)
        return types.SimpleNamespace(last_hidden_state=self.model.norm.forward(h), hidden_states=seen)

    def _native_forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kwargs: dict[str, Any],
        hidden_layers: tuple[int, ...],
        seen: dict[int, torch.Tensor],
    ) -> torch.Tensor:
        """The same layers through the native pointwise kernels; each residual add is fused with the norm
        that follows it (the next layer's input norm, and the final norm after the last layer)."""
        ops = self.native_ops
        batch, length, _ = h.shape
        cos, sin = cos.contiguous(), sin.contiguous()
        h = h.contiguous()
        x = ops.rms_norm(h, self.norms[0].weight, self.norms[0].variance_epsilon)
        for i, ((_, attn, norm_post, mlp, head_dim, qkv, gate_up), norm_next) in enumerate(
            zip(self.layers, self.norms[1:], strict=True)
        ):
            if hidden_layers and i in hidden_layers:
                seen[i] = h
            fused = qkv.whole(x)
            ops.rotary_(fused, cos, sin, (qkv.widths[0] + qkv.widths[1]) // head_dim, head_dim)
            q, k, v = (
                part.view(batch, length, -1, head_dim).transpose(1, 2) for part in fused.split(qkv.widths, -1)
            )
            out, _ = paged_attention_forward(attn, q, k, v, None, scaling=attn.scaling, **kwargs)
            attended = attn.o_proj.forward(out.reshape(batch, length, -1).contiguous())
            h, x = ops.add_rms_norm(h, attended, norm_post.weight, norm_post.variance_epsilon)
            mixed = mlp.down_proj.forward(ops.silu_mul(gate_up.whole(x)))
            h, x = ops.add_rms_norm(h, mixed, norm_next.weight, norm_next.variance_epsilon)
        return x


def _joint(*linears: torch.nn.Module) -> Joint:
    """One packed GEMM for linears sharing their input when they are packed, else their own calls."""
    fused = fuse_packed(*linears)
    return fused or (lambda x: tuple(m.forward(x) for m in linears))
