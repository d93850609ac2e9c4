"""VibeVoice's language model on the AR engine, each frame's latent, sound and next input made in the
post-sample hook.

VibeVoice (transformers' `VibeVoiceForConditionalGeneration`) speaks in continuous acoustic latents at
7.5 frames a second. Each step its Qwen2 LM picks one of four tokens (another frame, a segment's end, a new
segment, the end of speech); for "another frame" a diffusion head denoises the frame's latent from the LM's
hidden state (DPM-Solver, v-prediction, classifier-free guidance against an unconditional branch), the
acoustic tokenizer's causal decoder turns it into sound, the semantic tokenizer's causal encoder reads that
sound back, and the next input is the latent's projection plus the semantic features' (`generate`'s loop).

On the engine: the LM is the engine's decoder (paged KV, batched); its head computes only the four
tokens' logits (the reference masks every other id; the argmax is the same). The hook (`vibevoice_frame`)
does the rest for the step's sequences in one batch:
- the unconditional branch, as the reference keeps it: a sequence of its own that starts from the
  audio-start token, reads the same inputs as the LM but only on frame steps, and restarts (attending
  nothing before) at every new segment; its positions run on across restarts. Its KV lives on the request
  (`VibeState`), attended with SDPA through the LM's own layers;
- the diffusion head over every frame row at once, each request with its own noise (`step_noise`: the
  request's seed and the step) and guidance scale, grouped by step count;
- the acoustic decoder and semantic encoder, causal convolutions whose carried inputs are kept per
  request and batched across requests each step.
A request's state is advanced only once its whole batch succeeded (a failed batch is retried a sequence at
a time from the same state), and lives on its `VibeState`, so preemption (recompute from the fed
embeddings) and prefix caching leave it as it is. The frame's samples leave as `tensors["audio"]`.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import torch
from torch import nn

from omnistage.families.shared.step_noise import step_noise
from omnistage.stages.ar.attention import ATTENTION_NAME
from omnistage.stages.ar.loader import LoadedModel
from omnistage.stages.ar.post_sample import PostSample, SampledStep


@dataclasses.dataclass
class VibeState:
    """A request's VibeVoice state (ARInputs.extension): its diffusion settings and seed, and what the
    hook carries from step to step (the next step it expects, the input it fed last, the unconditional
    branch's KV since its last restart and its next position, the causal convolutions' carried inputs)."""

    seed: int
    guidance_scale: float = 1.3
    diffusion_steps: int = 10
    step: int = 0
    last_input: torch.Tensor | None = None  # [H]
    negative_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per layer [kv_heads, n, head_dim]
    negative_position: int = 0
    acoustic: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # conv key → [1, C, pad]
    semantic: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


class FourTokenHead(nn.Module):
    """The engine's head: the LM head's logits for the four tokens VibeVoice decodes, every other id at
    -inf (the reference's `VibeVoiceTokenConstraintProcessor`), reading four rows of the head."""

    def __init__(self, head: nn.Linear, ids: list[int], vocab: int):
        super().__init__()
        self.vocab = vocab
        self.register_buffer("ids", torch.tensor(ids), persistent=False)
        self.register_buffer("rows", head.weight[ids].detach().clone(), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = torch.full(
            (*hidden.shape[:-1], self.vocab), float("-inf"), dtype=hidden.dtype, device=hidden.device
        )
        logits[..., self.ids] = hidden @ self.rows.T
        return logits


@dataclasses.dataclass
class VibeModel(LoadedModel):
    """The AR engine's parts, and the model the hook and the input processor read."""

    vibe: nn.Module | None = None  # VibeVoiceForConditionalGeneration
    scheduler: Any = None  # the checkpoint's noise scheduler (a template, copied per step)
    ids: dict[str, int] = dataclasses.field(default_factory=dict)  # eos, bos, end, token
    hop: int = 0  # samples a frame
    sample_rate: int = 24000
    root_dir: str = ""  # the checkpoint directory (its feature extractor's config)

    @property
    def latent_size(self) -> int:
        return int(self.vibe.config.audio_config.hidden_size)


def marker_ids(config: Any) -> dict[str, int]:
    """The four tokens VibeVoice decodes, by role: end of speech, a new segment, a segment's end, another
    frame (a `VibeVoiceConfig`'s ids)."""
    return {
        "eos": int(config.eos_token_id),
        "bos": int(config.audio_bos_token_id),
        "end": int(config.audio_eos_token_id),
        "token": int(config.audio_token_id),
    }


def load_vibevoice(model_dir: str, dtype: torch.dtype, device: str) -> VibeModel:
    """The AR engine's `model_loader` for a VibeVoice checkpoint directory (`from_pretrained`)."""
    from transformers import AutoTokenizer, VibeVoiceForConditionalGeneration

    vibe = VibeVoiceForConditionalGeneration.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    lm = vibe.model.language_model
    lm.config._attn_implementation = ATTENTION_NAME  # the engine's decoder attends through the paged cache
    config = vibe.config
    ids = marker_ids(config)
    text = config.text_config
    model = vibe.model
    return VibeModel(
        embed=lm.get_input_embeddings(),
        decoder=lm,
        head=FourTokenHead(vibe.lm_head, sorted(ids.values()), int(text.vocab_size)),
        config=lm.config,
        tokenizer=AutoTokenizer.from_pretrained(model_dir),
        eos_token_ids=[ids["eos"]],
        root=vibe,
        step_modules=[model.diffusion_head, model.multi_modal_projector, model.semantic_connector],
        vibe=vibe,
        scheduler=vibe._build_default_noise_scheduler(vibe.generation_config),
        ids=ids,
        hop=int(config.audio_config.hop_length),
        root_dir=str(model_dir),
    )


def default_guidance(model: VibeModel) -> tuple[float, int]:
    """The checkpoint's guidance scale and diffusion steps (`generate`'s defaults: 1.0 and 10)."""
    gen = model.vibe.generation_config
    return float(getattr(gen, "guidance_scale", None) or 1.0), int(
        getattr(gen, "num_diffusion_steps", None) or 10
    )


def new_state(params: Any, guidance_scale: float, diffusion_steps: int) -> VibeState:
    seed = getattr(params, "seed", None)
    return VibeState(
        seed=int(seed) if seed is not None else random.getrandbits(62),
        guidance_scale=float(guidance_scale),
        diffusion_steps=int(diffusion_steps),
    )


# ---- the unconditional branch -------------------------------------------------------------------------


def _negative_step(
    model: VibeModel, states: list[VibeState], inputs: torch.Tensor
) -> tuple[torch.Tensor, list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """One step of each state's unconditional branch on `inputs` [B, H] (each at its own position, each
    attending its KV since its last restart): its last hidden state [B, H] and each row's KV after it."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    lm = model.decoder
    rows = len(states)
    positions = torch.tensor([[s.negative_position] for s in states], device=inputs.device)
    lengths = [0 if s.negative_kv is None else int(s.negative_kv[0][0].shape[1]) for s in states]
    longest = max(lengths) + 1
    # [B, 1, 1, K]: each row's own past, right-padded, then its new key (the last column)
    mask = torch.zeros(rows, 1, 1, longest, dtype=torch.bool, device=inputs.device)
    for i, n in enumerate(lengths):
        mask[i, 0, 0, :n] = True
    mask[..., -1] = True
    x = inputs[:, None]
    cos, sin = lm.rotary_emb(x, positions)
    out_kv: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(rows)]
    for index, layer in enumerate(lm.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        shape = (rows, 1, -1, attn.head_dim)
        q = attn.q_proj(h).view(shape).transpose(1, 2)
        k = attn.k_proj(h).view(shape).transpose(1, 2)
        v = attn.v_proj(h).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys = k.new_zeros(rows, k.shape[1], longest, attn.head_dim)
        values = torch.zeros_like(keys)
        keys[:, :, -1:], values[:, :, -1:] = k, v
        for i, (state, n) in enumerate(zip(states, lengths, strict=True)):
            row_k, row_v = k[i], v[i]  # [kv_heads, 1, head_dim]
            if n:
                past_k, past_v = state.negative_kv[index]
                keys[i, :, :n], values[i, :, :n] = past_k, past_v
                row_k, row_v = torch.cat((past_k, row_k), 1), torch.cat((past_v, row_v), 1)
            out_kv[i].append((row_k, row_v))
        o = nn.functional.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=attn.scaling, enable_gqa=True
        )
        x = x + attn.o_proj(o.transpose(1, 2).reshape(rows, 1, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return lm.norm(x)[:, 0], out_kv


# ---- the diffusion head --------------------------------------------------------------------------------


def _latents(
    model: VibeModel,
    positive: torch.Tensor,
    negative: torch.Tensor,
    states: list[VibeState],
    steps: list[int],
) -> torch.Tensor:
    """Each row's latent [B, D] by the reference's `_sample_audio_latent` (its scheduler, its guidance),
    from the row's own noise; rows with the same step count denoised together."""
    import copy

    head = model.vibe.model.diffusion_head
    dtype = positive.dtype
    out = torch.empty(len(states), model.latent_size, dtype=dtype, device=positive.device)
    for count in sorted({s.diffusion_steps for s in states}):
        rows = [i for i, s in enumerate(states) if s.diffusion_steps == count]
        noise = torch.stack([step_noise(states[i].seed, steps[i], (model.latent_size,)) for i in rows])
        latent = noise.to(positive.device, dtype)
        scale = torch.tensor([states[i].guidance_scale for i in rows], dtype=dtype, device=positive.device)
        condition = torch.cat((positive[rows], negative[rows]))
        scheduler = copy.deepcopy(model.scheduler)
        scheduler.set_timesteps(num_inference_steps=count)
        for t in scheduler.timesteps:
            both = torch.cat((latent, latent))
            eps = head(both, t.repeat(both.shape[0]).to(both), condition=condition)
            cond, uncond = eps.chunk(2)
            guided = uncond + scale[:, None] * (cond - uncond)
            latent = scheduler.step(guided, t, latent).prev_sample
        out[rows] = latent
    return out


# ---- the causal convolutions ---------------------------------------------------------------------------


def _streamed(module: Any, x: torch.Tensor, carried: list[dict[str, torch.Tensor]]) -> tuple[Any, list]:
    """`module(x, padding_cache=..., use_cache=True)` over a batch whose rows each continue their own
    stream (`carried[i]`: conv key → [1, C, pad], empty for a new one); returns the output and each row's
    carried inputs after it."""
    from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
        VibeVoiceAcousticTokenizerConv1dCacheLayer as CacheLayer,
    )
    from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
        VibeVoiceAcousticTokenizerConv1dPaddingCache as PaddingCache,
    )

    cache = PaddingCache()
    known = next((c for c in carried if c), None)
    if known is not None:
        for key, like in known.items():
            layer = CacheLayer()
            layer.left_pad, layer.in_channels = like.shape[-1], like.shape[1]
            layer.cache = torch.cat([c[key] if c else torch.zeros_like(like) for c in carried])
            layer.is_initialized = True
            cache.layers[key] = layer
    out = module(x, padding_cache=cache, use_cache=True)
    rows = [
        {key: layer.cache[i : i + 1].clone() for key, layer in cache.layers.items()}
        for i in range(len(carried))
    ]
    return out, rows


# ---- the hook ------------------------------------------------------------------------------------------


def vibevoice_frame(model: VibeModel, step: SampledStep) -> PostSample:
    """Post-sample hook: for each sequence that chose "another frame", its latent (diffusion against its
    unconditional branch), the frame's samples (`tensors["audio"]`, [hop]) and the next input; a new
    segment restarts the branch; every other row is fed its token's embedding."""
    ids = model.ids
    states = [_state(inputs) for inputs in step.inputs]
    for state, k in zip(states, step.steps, strict=True):
        if state.step != k:
            raise RuntimeError(f"VibeVoice state at step {state.step}, asked for step {k}")
    tokens = step.token_ids
    embed = model.embed
    next_embeds = embed(tokens).to(step.hidden.dtype)
    frames = [i for i, t in enumerate(tokens.tolist()) if t == ids["token"]]
    audio: list[torch.Tensor | None] = [None] * len(states)
    updates: dict[int, dict[str, Any]] = {i: {} for i in range(len(states))}
    if frames:
        chosen = [states[i] for i in frames]
        start = embed(torch.tensor([ids["bos"]], device=tokens.device))[0]
        inputs = torch.stack([start if s.last_input is None else s.last_input for s in chosen])
        negative, kv = _negative_step(model, chosen, inputs.to(step.hidden.dtype))
        latents = _latents(model, step.hidden[frames], negative, chosen, [step.steps[i] for i in frames])
        vibe = model.vibe.model
        scaled = latents / vibe.latent_scaling_factor - vibe.latent_bias_factor
        decoded, acoustic = _streamed(
            lambda x, **kw: vibe.audio_tower.decode(x, **kw), scaled[:, None], [s.acoustic for s in chosen]
        )
        wave = decoded.audio  # [F, 1, hop]
        semantic, carried = _streamed(vibe.semantic_tokenizer_encoder, wave, [s.semantic for s in chosen])
        fed = vibe.multi_modal_projector(latents[:, None]) + vibe.semantic_connector(semantic.latents)
        for j, i in enumerate(frames):
            next_embeds[i] = fed[j, 0]
            audio[i] = wave[j, 0].float()[None]
            updates[i] = {
                "negative_kv": kv[j],
                "negative_position": chosen[j].negative_position + 1,
                "acoustic": acoustic[j],
                "semantic": carried[j],
            }
    for i, (state, t) in enumerate(zip(states, tokens.tolist(), strict=True)):
        if t == ids["bos"]:  # a new segment: its branch attends nothing before it
            updates[i]["negative_kv"] = None
        for key, value in updates[i].items():
            setattr(state, key, value)
        state.last_input = next_embeds[i].detach().clone()
        state.step += 1
    latent_rows: list[torch.Tensor | None] = [None] * len(states)
    for j, i in enumerate(frames):
        latent_rows[i] = latents[j].float()[None]
    return PostSample(next_embeds=next_embeds, tensors={"audio": audio, "latents": latent_rows})


def _state(inputs: Any) -> VibeState:
    extension = getattr(inputs, "extension", None)
    if not isinstance(extension, VibeState):
        raise ValueError("a VibeVoice request needs its VibeState (ARInputs.extension); see speech_prompt")
    return extension
