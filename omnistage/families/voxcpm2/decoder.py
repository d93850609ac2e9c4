"""VoxCPM2's language models on the AR engine, each step's latent patch made in the post-sample hook.

VoxCPM2 (the `voxcpm` package's `VoxCPM2Model`) speaks in continuous latents: per step, a MiniCPM-4 base LM
reads the last patch's embedding, its output is scalar-quantized (FSQ) at audio positions, a small residual
LM reads that fused with the patch embedding, and a local DiT turns both hidden states into the next patch
of `patch_size` VAE latents by flow matching (Euler steps, classifier-free guidance against an empty
condition); a local encoder embeds the patch for the next step, and a stop head on the base LM's state says
when to end. The checkpoint loads through `VoxCPM2Model.from_local`.

On the engine: both LMs run as one packed decoder (`PackedVoxCPMDecoder`: the base layers, then the FSQ
and fusion, then the residual layers, each layer on its own slice of the paged KV cache) whose hidden state
is the two LMs' outputs side by side; the engine's head is the stop head (token 1 ends a request, as the
reference's stop flag does; `min_tokens` is its `min_len` + 1). The post-sample hook (`voxcpm_patch`) runs
the DiT batched over the step's sequences, each with its own noise (`step_noise`: the request's seed and
the step) and guidance value, emits the patch (`tensors["latents"]`, [P, D] a step) and feeds its local
encoding back. The previous patch, the DiT's prefix condition, is kept on the request's `VoxPrompt`
(written once a step, so a retried step finds the same value).
"""

from __future__ import annotations

import dataclasses
import math
import random
import types
from typing import Any

import torch
from torch import nn

from omnistage.families.shared.step_noise import step_noise
from omnistage.stages.ar.attention import ATTENTION_NAME, METADATA_KWARG, paged_attention_forward
from omnistage.stages.ar.loader import LoadedModel
from omnistage.stages.ar.post_sample import PostSample, SampledStep

AUDIO_KWARG = "voxcpm_audio"  # the decoder's per-row "audio position" mask (an extra forward input)


@dataclasses.dataclass
class VoxPrompt:
    """A request's VoxCPM2 state (ARInputs.extension): which prompt positions are audio (FSQ'd, their
    embedding fused into the residual LM), the patch before the first generated one (the DiT's first prefix
    condition: the prompt's last audio patch, zeros without one), the flow-matching settings, the seed, and
    the patches made so far by step."""

    audio_mask: torch.Tensor  # [L] bool
    first_cond: torch.Tensor  # [P, D]
    cfg_value: float = 2.0
    timesteps: int = 10
    seed: int = 0
    patches: dict[int, torch.Tensor] = dataclasses.field(default_factory=dict)

    def cond(self, step: int) -> torch.Tensor:
        return self.first_cond if step == 0 else self.patches[step - 1]


class TextEmbedding(nn.Module):
    """Token ids → the base LM's input rows (`embed_tokens` x `scale_emb` under muP, as the reference)."""

    def __init__(self, table: nn.Embedding, scale: float):
        super().__init__()
        self.table, self.scale = table, scale
        self.num_embeddings, self.embedding_dim = table.num_embeddings, table.embedding_dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.table(ids) * self.scale


class StopHead(nn.Module):
    """The engine's head: the stop predictor's two logits (go on, stop) from the base LM's half."""

    def __init__(self, model: nn.Module, width: int):
        super().__init__()
        self.proj, self.act, self.head, self.width = model.stop_proj, model.stop_actn, model.stop_head, width

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.proj(hidden[..., : self.width])))


class PackedVoxCPMDecoder(nn.Module):
    """Base LM → FSQ at audio rows → fusion → residual LM over the engine's packed rows:
    forward(inputs_embeds=[1, T, H], position_ids=[1, T], omni_attn=..., voxcpm_audio=[T] bool) →
    last_hidden_state [1, T, 2H] (the base LM's output, FSQ'd where audio, beside the residual LM's)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.base, self.residual = model.base_lm, model.residual_lm
        self.fsq, self.fusion = model.fsq_layer, model.fusion_concat_proj
        self.offset = len(self.base.layers)  # the residual layers' KV slots follow the base layers'

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, **kwargs: Any) -> Any:
        meta, audio = kwargs[METADATA_KWARG], kwargs[AUDIO_KWARG]
        x_in = inputs_embeds[0]
        positions = position_ids.reshape(-1)
        x = self._stack(self.base, x_in, positions, meta, 0)
        audio = audio.to(x.device)[:, None]
        x = torch.where(audio, self.fsq(x), x)
        fused = self.fusion(torch.cat((x, audio * x_in), dim=-1))
        r = self._stack(self.residual, fused, positions, meta, self.offset)
        return types.SimpleNamespace(last_hidden_state=torch.cat((x, r), dim=-1)[None])

    def _stack(self, lm: nn.Module, x: torch.Tensor, positions: torch.Tensor, meta: Any, first: int) -> Any:
        from voxcpm.modules.minicpm4.model import apply_rotary_pos_emb

        rope = lm.rope_emb(positions) if lm.rope_emb is not None else None
        rows = x.shape[0]
        for i, layer in enumerate(lm.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(rows, attn.num_heads, attn.head_dim).transpose(0, 1)[None]
            k = attn.k_proj(h).view(rows, attn.num_key_value_heads, attn.head_dim).transpose(0, 1)[None]
            v = attn.v_proj(h).view(rows, attn.num_key_value_heads, attn.head_dim).transpose(0, 1)[None]
            if rope is not None:
                q, k = apply_rotary_pos_emb(q, k, *rope)
            slot = types.SimpleNamespace(layer_idx=first + i)
            o, _ = paged_attention_forward(slot, q, k, v, None, **{METADATA_KWARG: meta})
            scale = layer.scale_depth / math.sqrt(layer.num_hidden_layers) if layer.use_mup else 1.0
            x = x + attn.o_proj(o.reshape(rows, -1)) * scale
            x = x + layer.mlp(layer.post_attention_layernorm(x)) * scale
        return lm.norm(x)


@dataclasses.dataclass
class VoxCPMModel(LoadedModel):
    """The AR engine's parts and what the input processor and the hook need."""

    vox: nn.Module | None = None  # VoxCPM2Model
    width: int = 0  # the LMs' hidden size

    @property
    def patch_size(self) -> int:
        return int(self.vox.patch_size)

    @property
    def feat_dim(self) -> int:
        return int(self.vox.feat_dim)

    @torch.inference_mode()
    def clip_patches(self, samples: torch.Tensor, padding: str) -> torch.Tensor:
        """A clip (mono float samples at the VAE's input rate) → its latent patches [T, P, D], as the
        reference's `_encode_wav`: padded to whole patches on the `padding` side, then VAE-encoded."""
        vae = self.vox.audio_vae
        hop = self.patch_size * int(vae.chunk_size)
        audio = samples.reshape(1, -1)
        extra = -audio.shape[1] % hop
        if extra:
            audio = nn.functional.pad(audio, (extra, 0) if padding == "left" else (0, extra))
        device = next(vae.parameters()).device
        feat = vae.encode(audio.to(device), int(vae.sample_rate)).cpu()
        return feat.view(int(vae.latent_dim), -1, self.patch_size).permute(1, 2, 0).contiguous()

    def patch_embeds(self, patches: torch.Tensor) -> torch.Tensor:
        """[S, P, D] patches → [S, H]: the local encoder's embedding, projected to the LM (the next input)."""
        dtype = self.vox.enc_to_lm_proj.weight.dtype
        return self.vox.enc_to_lm_proj(self.vox.feat_encoder(patches[:, None].to(dtype)))[:, 0]


def load_voxcpm(model_dir: str, dtype: torch.dtype, device: str) -> VoxCPMModel:
    """The AR engine's `model_loader` for a VoxCPM2 checkpoint directory."""
    from voxcpm.model.voxcpm2 import VoxCPM2Model

    vox = VoxCPM2Model.from_local(model_dir, optimize=False, device=device)
    vox = vox.to(dtype).eval()
    vox.audio_vae.float()  # as the reference keeps it: it encodes a cloned voice's clip (clip_patches)
    lm = vox.config.lm_config
    heads = lm.num_attention_heads
    config = types.SimpleNamespace(
        num_hidden_layers=len(vox.base_lm.layers) + len(vox.residual_lm.layers),
        num_attention_heads=heads,
        num_key_value_heads=lm.num_key_value_heads,
        head_dim=lm.kv_channels or lm.hidden_size // heads,
        hidden_size=lm.hidden_size,
        vocab_size=lm.vocab_size,
        max_position_embeddings=lm.max_position_embeddings,
        _attn_implementation=ATTENTION_NAME,  # the packed decoder attends through the paged cache
    )
    scale = lm.scale_emb if lm.use_mup else 1.0
    return VoxCPMModel(
        embed=TextEmbedding(vox.base_lm.embed_tokens, scale),
        decoder=PackedVoxCPMDecoder(vox),
        head=StopHead(vox, lm.hidden_size),
        config=config,
        tokenizer=None,  # what the engine appends are stop flags; the input processor tokenizes
        eos_token_ids=[1],  # the stop flag
        root=vox,
        vox=vox,
        width=lm.hidden_size,
    )


def audio_rows(batch: list[Any], offsets: list[int], total: int, device: torch.device) -> dict[str, Any]:
    """The extra-input builder: which packed rows are audio positions (a prompt's audio patches, and every
    generated position)."""
    mask = torch.ones(total, dtype=torch.bool)
    for item, offset in zip(batch, offsets, strict=True):
        prompt = item.seq.request.inputs.extension.audio_mask
        start, end = item.start, item.start + item.num_tokens
        upto = min(end, len(prompt))
        if start < upto:
            mask[offset : offset + upto - start] = prompt[start:upto]
    return {AUDIO_KWARG: mask.to(device)}


def _t_span(timesteps: int, dtype: torch.dtype, device: Any) -> torch.Tensor:
    """The reference CFM's time grid (`UnifiedCFM.forward`, sway sampling coefficient 1)."""
    t = torch.linspace(1, 0, timesteps + 1, device=device, dtype=dtype)
    return t + (torch.cos(torch.pi / 2 * t) - 1 + t)


def voxcpm_patch(model: VoxCPMModel, step: SampledStep) -> PostSample:
    """Post-sample hook: each sequence's next latent patch (the DiT's flow matching, batched; each request's
    own noise and guidance value), emitted as `latents` [S, P, D], and its local encoding fed back."""
    vox, width = model.vox, model.width
    dtype = vox.lm_to_dit_proj.weight.dtype
    hidden = step.hidden.to(dtype)
    mu = torch.cat((vox.lm_to_dit_proj(hidden[:, :width]), vox.res_to_dit_proj(hidden[:, width:])), dim=-1)
    prompts = [_prompt(inputs) for inputs in step.inputs]
    size, dim = model.patch_size, model.feat_dim
    cond = torch.stack([p.cond(k) for p, k in zip(prompts, step.steps, strict=True)]).to(mu.device, dtype)
    noise = torch.stack(
        [step_noise(p.seed, k, (dim, size)) for p, k in zip(prompts, step.steps, strict=True)]
    )
    patches = torch.empty(len(prompts), size, dim, dtype=dtype, device=mu.device)
    for timesteps in sorted({p.timesteps for p in prompts}):
        rows = [i for i, p in enumerate(prompts) if p.timesteps == timesteps]
        cfg = torch.tensor([prompts[i].cfg_value for i in rows], dtype=dtype, device=mu.device)[:, None, None]
        out = vox.feat_decoder.solve_euler(
            x=noise[rows].to(mu.device, dtype),
            t_span=_t_span(timesteps, dtype, mu.device),
            mu=mu[rows],
            cond=cond[rows].transpose(1, 2).contiguous(),
            cfg_value=cfg,
            use_cfg_zero_star=True,
        )
        patches[rows] = out.transpose(1, 2)
    for p, k, patch in zip(prompts, step.steps, patches, strict=True):
        p.patches.setdefault(k, patch.detach().to("cpu"))
    return PostSample(next_embeds=model.patch_embeds(patches), tensors={"latents": patches.float()})


def _prompt(inputs: Any) -> VoxPrompt:
    extension = getattr(inputs, "extension", None)
    if not isinstance(extension, VoxPrompt):
        raise ValueError("a VoxCPM2 request needs its VoxPrompt (ARInputs.extension); see decoder_prompt")
    return extension


@torch.inference_mode()
def decoder_prompt(
    model: VoxCPMModel,
    text: str,
    params: Any,
    prompt_feat: torch.Tensor | None = None,
    prompt_text: str = "",
    ref_feat: torch.Tensor | None = None,
    cfg_value: float = 2.0,
    timesteps: int = 10,
) -> tuple[list[int], Any]:
    """The base LM's prompt as `VoxCPM2Model._generate` builds it: [ref_start, the reference clip's patches,
    ref_end] (a voice to clone, `ref_feat` [R, P, D]), the text (`prompt_text` + `text`) and the audio-start
    marker, then a clip to continue (`prompt_feat` [T, P, D], what `prompt_text` says). Returns the prompt's
    token ids (zeros at audio positions, as the reference's) and ARInputs (embeddings, VoxPrompt)."""
    from omnistage.stages.ar.ar_inputs import ARInputs

    vox = model.vox
    size, dim = model.patch_size, model.feat_dim
    tokenizer = vox.text_tokenizer
    ids = list(tokenizer(prompt_text + text)) + [vox.audio_start_token]
    tokens, feats, audio = list(ids), [torch.zeros(len(ids), size, dim)], [False] * len(ids)
    if ref_feat is not None:
        ref = [vox.ref_audio_start_token] + [0] * ref_feat.shape[0] + [vox.ref_audio_end_token]
        tokens = ref + tokens
        feats = [torch.zeros(1, size, dim), ref_feat.float(), torch.zeros(1, size, dim), *feats]
        audio = [False] + [True] * ref_feat.shape[0] + [False] + audio
    if prompt_feat is not None:
        tokens += [0] * prompt_feat.shape[0]
        feats.append(prompt_feat.float())
        audio += [True] * prompt_feat.shape[0]
    feat = torch.cat(feats)
    device, dtype = vox.enc_to_lm_proj.weight.device, vox.enc_to_lm_proj.weight.dtype
    mask = torch.tensor(audio)
    feat_embed = vox.enc_to_lm_proj(vox.feat_encoder(feat[None].to(device, dtype)))[0]
    text_embed = model.embed(torch.tensor(tokens, device=device))
    embeds = (~mask)[:, None].to(device, dtype) * text_embed + mask[:, None].to(device, dtype) * feat_embed
    seed = getattr(params, "seed", None)
    state = VoxPrompt(
        audio_mask=mask,
        first_cond=feat[-1],
        cfg_value=float(cfg_value),
        timesteps=int(timesteps),
        seed=int(seed) if seed is not None else random.getrandbits(62),
    )
    return tokens, ARInputs(inputs_embeds=embeds, extension=state)
