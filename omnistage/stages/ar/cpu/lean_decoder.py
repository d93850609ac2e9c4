"""The decoder stack of Llama-style models (their layer forms registered by their families), evaluated
without transformers' per-call machinery.

At decode batch sizes a small model's step pays for Python around its tensor ops: the decorated `forward`
of the model (output capture, config defaults, deprecation shims, causal-mask dispatch), then per layer six
module calls and their hooks, and one GEMM call per linear. `LeanDecoder` runs the same tensor ops, in the
same order, on the same weights (packed ones where the engine packed them; q/k/v and gate/up as one packed
GEMM each, which is bit-identical) and with the same paged attention function, so its outputs equal the
model's forward (tested bit for bit). On an omni model's benchmark talker (4 layers of width 256, 8
sequences) a decode step takes 7.6 ms this way against 8.1-8.9 ms through the model's forward.

Only layer types whose arithmetic is known are run this way (`supports`: a family registered their form,
layer_forms.py); anything else keeps the model's own forward (the engine logs which, and why, at load:
`describe`). Per-head q/k norms run as the model's own norm modules, and a mixture-of-experts block is called
as the model calls it: the lean stack saves the Python around it, not the experts' own dispatch.

Where the native kernels are built (native.py: AVX-512 or AVX2 CPUs) and every joint GEMM is packed or
weight-only quantized, each layer's pointwise work runs as four native calls instead of some thirty torch
ops: RMS norm fused with the residual add before it, rotary embedding in place on the q/k/v GEMM's output,
and SiLU-times-up. Rotary is bit-identical there; the norms sum their squares in another order, and float32
SiLU uses another e^x, so hidden states differ from the model's forward by float rounding (bf16 ones almost
never), and greedy tokens equal transformers' (tested). `native_ops = None` keeps the torch ops.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from omnistage.stages.ar.attention import paged_attention_forward
from omnistage.stages.ar.cpu import native
from omnistage.stages.ar.cpu.layer_forms import layer_form
from omnistage.stages.ar.cpu.packed_linear import Joint, JointLinear, fuse_packed
from omnistage.stages.ar.cpu.quantized_linear import QuantizedJoint


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
        form = layer_form(name)
        if form is None:
            return f"{name} has no registered layer form (stages/ar/cpu/layer_forms.py)"
        attn, mlp = layer.self_attn, layer.mlp
        if type(attn).__name__ != form.attention or getattr(attn, "sliding_window", None) is not None:
            return f"{name}: attention {type(attn).__name__} (or a sliding window)"
        norms = [layer.input_layernorm, layer.post_attention_layernorm, model.norm]
        norms += [n for n in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)) if n is not None]
        if any(type(n).__name__ not in form.norms for n in norms):
            return f"{name}: norms other than {'/'.join(form.norms)}"
        if not _gated_silu(mlp) and type(mlp).__name__ != form.experts:
            experts = form.experts or "experts"
            return f"{name}: MLP {type(mlp).__name__} is neither a SiLU-gated MLP nor {experts}"
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


@dataclasses.dataclass(slots=True)
class _Layer:
    """One decoder layer's parts as the lean stack calls them."""

    norm_in: torch.nn.Module
    attn: torch.nn.Module
    norm_post: torch.nn.Module
    mlp: torch.nn.Module
    head_dim: int
    qkv: Joint
    gate_up: Joint | None  # None: the MLP is called as the model calls it (a mixture of experts)
    q_norm: torch.nn.Module | None  # per-head RMS norms of q and k, before rotary (where the layer has them)
    k_norm: torch.nn.Module | None
    qk_weight: torch.Tensor | None  # both norms' weights, head by head (_norm_heads_)


class LeanDecoder:
    """Called as the model is by the engine: `(inputs_embeds=[1, T, H], position_ids=..., **kwargs)` →
    an object with `.last_hidden_state`. `input_proj` (optional) maps the inputs first. `attention` has
    transformers' attention signature and gets the call's kwargs: the engine's paged attention by default
    (dense_kv.py's for a batch of short runs with their own cache, e.g. a code predictor's frame)."""

    def __init__(
        self,
        model: Any,
        input_proj: torch.nn.Module | None = None,
        attention: Callable[..., tuple[torch.Tensor, Any]] = paged_attention_forward,
    ):
        self.model = model
        self.input_proj = input_proj
        self.attention = attention
        self.layers = [_layer(layer) for layer in model.layers]
        self.norms = [layer.input_layernorm for layer in model.layers] + [model.norm]
        self.native_reason = self._native_reason()
        self.native_ops = native.kernels() if self.native_reason is None else None

    def _native_reason(self) -> str | None:
        """Why the native kernels do not apply to every layer (None: they do). They need to be built here,
        packed joint GEMMs, and norm weights of one float32/bf16 dtype on the CPU."""
        weights = [n.weight for n in self.norms] + [layer.norm_post.weight for layer in self.layers]
        dtypes = {w.dtype for w in weights}
        joints = [j for layer in self.layers for j in (layer.qkv, layer.gate_up) if j is not None]
        if native.kernels() is None:
            return "the native kernels are not built here"
        if len(dtypes) != 1 or next(iter(dtypes)) not in native.DTYPES:
            return f"norm weights of dtype {sorted(map(str, dtypes))}"
        if not all(w.device.type == "cpu" for w in weights):
            return "weights off the CPU"
        if not all(isinstance(j, JointLinear | QuantizedJoint) for j in joints):
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
        for i, layer in enumerate(self.layers):
            if hidden_layers and i in hidden_layers:
                seen[i] = h
            attn, dim = layer.attn, layer.head_dim
            x = layer.norm_in.forward(h)
            q, k, v = (part.view(batch, length, -1, dim) for part in layer.qkv(x))
            if layer.q_norm is not None:
                q, k = layer.q_norm.forward(q), layer.k_norm.forward(k)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            out, _ = self.attention(attn, q, k, v, None, scaling=attn.scaling, **kwargs)
            h = h + attn.o_proj.forward(out.reshape(batch, length, -1).contiguous())
            x = layer.norm_post.forward(h)
            if layer.gate_up is None:
                h = h + layer.mlp(x)
                continue
            gate, up = layer.gate_up(x)
            h = h + layer.mlp.down_proj.forward(F.silu(gate) * up)
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
        that follows it (the next layer's input norm, and the final norm after the last layer). Per-head q/k
        norms and a mixture-of-experts MLP stay torch ops."""
        ops = self.native_ops
        batch, length, _ = h.shape
        cos, sin = cos.contiguous(), sin.contiguous()
        h = h.contiguous()
        x = ops.rms_norm(h, self.norms[0].weight, self.norms[0].variance_epsilon)
        for i, (layer, norm_next) in enumerate(zip(self.layers, self.norms[1:], strict=True)):
            if hidden_layers and i in hidden_layers:
                seen[i] = h
            attn, dim, qkv = layer.attn, layer.head_dim, layer.qkv
            fused = qkv.whole(x)
            if layer.q_norm is not None:
                _norm_heads_(fused, qkv.widths, dim, layer)
            ops.rotary_(fused, cos, sin, (qkv.widths[0] + qkv.widths[1]) // dim, dim)
            q, k, v = (
                part.view(batch, length, -1, dim).transpose(1, 2) for part in fused.split(qkv.widths, -1)
            )
            out, _ = self.attention(attn, q, k, v, None, scaling=attn.scaling, **kwargs)
            attended = attn.o_proj.forward(out.reshape(batch, length, -1).contiguous())
            h, x = ops.add_rms_norm(h, attended, layer.norm_post.weight, layer.norm_post.variance_epsilon)
            if layer.gate_up is None:
                mixed = layer.mlp(x).contiguous()
            else:
                mixed = layer.mlp.down_proj.forward(ops.silu_mul(layer.gate_up.whole(x)))
            h, x = ops.add_rms_norm(h, mixed, norm_next.weight, norm_next.variance_epsilon)
        return x


def _norm_heads_(fused: torch.Tensor, widths: list[int], dim: int, layer: _Layer) -> None:
    """Per-head q and k norms, in place on the q/k/v GEMM's output (before rotary, as the model).
    With one epsilon for both, q's and k's heads are normed together: the norm modules' own ops on the
    same rows, with each head's weight (`qk_weight`), so the same numbers in half the calls."""
    q_width, k_width = widths[0], widths[1]
    shape = (*fused.shape[:-1], -1, dim)
    if layer.qk_weight is not None:
        qk = fused[..., : q_width + k_width]
        x = qk.view(shape).to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + layer.q_norm.variance_epsilon)
        qk.copy_((layer.qk_weight * x.to(fused.dtype)).view(qk.shape))
        return
    q = fused[..., :q_width]
    k = fused[..., q_width : q_width + k_width]
    q.copy_(layer.q_norm.forward(q.view(shape)).view(q.shape))
    k.copy_(layer.k_norm.forward(k.view(shape)).view(k.shape))


def _qk_weight(attn: torch.nn.Module, dim: int) -> torch.Tensor | None:
    """q_norm's weight for each q head, then k_norm's for each k head [Hq + Hk, D], for the native path (so
    None off the CPU; also without q/k norms, or with two epsilons). A copy, as the packed weights are."""
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if q_norm is None or k_norm is None or q_norm.variance_epsilon != k_norm.variance_epsilon:
        return None
    if q_norm.weight.device.type != "cpu":
        return None
    heads = [int(attn.q_proj.weight.shape[0]) // dim, int(attn.k_proj.weight.shape[0]) // dim]
    norms = (q_norm.weight.detach(), k_norm.weight.detach())
    return torch.cat([w.expand(n, dim) for w, n in zip(norms, heads, strict=True)])


def _layer(layer: torch.nn.Module) -> _Layer:
    attn, mlp = layer.self_attn, layer.mlp
    gated = _gated_silu(mlp)
    return _Layer(
        norm_in=layer.input_layernorm,
        attn=attn,
        norm_post=layer.post_attention_layernorm,
        mlp=mlp,
        head_dim=int(attn.head_dim),
        qkv=_joint(attn.q_proj, attn.k_proj, attn.v_proj),
        gate_up=_joint(mlp.gate_proj, mlp.up_proj) if gated else None,
        q_norm=getattr(attn, "q_norm", None),
        k_norm=getattr(attn, "k_norm", None),
        qk_weight=_qk_weight(attn, int(attn.head_dim)),
    )


def _gated_silu(mlp: torch.nn.Module) -> bool:
    """down(silu(gate(x)) * up(x)), the MLP the lean stack computes itself."""
    act = getattr(mlp, "act_fn", None)
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"
    return silu and all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj"))


def _joint(*linears: torch.nn.Module) -> Joint:
    """One packed GEMM for linears sharing their input when they are packed, else their own calls."""
    fused = fuse_packed(*linears)
    return fused or (lambda x: tuple(m.forward(x) for m in linears))
