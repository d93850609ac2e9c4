"""Higgs Audio v2's DualFFN decoder on the AR engine, every codebook of a frame picked in a post-sample hook.

The checkpoint loads through transformers' own `HiggsAudioV2ForConditionalGeneration.from_pretrained` on the
engine's paged attention. Its decoder layers route each position through one of two FFNs (and norms): text
positions through `mlp`, audio positions through `audio_mlp`. The reference tells them apart by token id in
the prompt (`audio_token_id` or `audio_delay_token_id`) and sends every generated position the audio way; here
the engine's token ids are the same (a generated frame appends `audio_token_id`/`audio_delay_token_id` as the
reference's `_sample` does), so one rule gives the mask everywhere, including a recompute after preemption:
`audio_mask` (an extra-input builder keyed on `HiggsSpeech`) from the step's token ids, and `HiggsDecoder`
runs the reference's own layers with it.

The hook (`frame_codes`) is the reference's `_sample` for one step, batched: the audio head's logits for all
codebooks, the delay-pattern processor (codebook k is the stream BOS for its first k+1 frames after
`<|audio_out_bos|>`; once a frame holds a stream EOS, codebook k is forced to EOS k+1 frames later), then
greedy or seeded sampling per request (`SeededPick`); the appended token is `audio_token_id`, the delay token
from the first frame with a stream EOS on, and `eos_token_id` for the all-EOS frame, which ends the request
(emitted, as the reference's `audio_sequences` hold it); the next input is the frame's audio embedding.
"""

from __future__ import annotations

import dataclasses
import random
import types
from typing import Any

import torch
from torch import nn

from omnistage.families.shared.depth_codes import SeededPick
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.attention import ATTENTION_NAME
from omnistage.stages.ar.extra_inputs import register_extra_input
from omnistage.stages.ar.loader import LoadedModel, load_tokenizer
from omnistage.stages.ar.post_sample import PostSample, SampledStep

MASK_KWARG = "audio_mask"


@dataclasses.dataclass
class HiggsSpeech:
    """A request's Higgs state (`ARInputs.extension`): its sampling (None: greedy), the delay pattern's start
    as the prompt's last tokens set it (the reference's processor reads the last `num_codebooks` tokens), the
    ids that mark audio positions."""

    spec: dict[str, Any] | None = None
    bos_delay: list[int] = dataclasses.field(default_factory=list)
    eos_delay: list[int] = dataclasses.field(default_factory=list)
    ends_with_delay: bool = False
    audio_ids: tuple[int, int] = (128016, 128014)


class HiggsDecoder(nn.Module):
    """The reference's `HiggsAudioV2Model` stack called packed: rotary embedding, its DualFFN layers with the
    step's audio mask (`audio_mask`, [1, T] bool), its final norm; attention is the engine's (the metadata
    kwarg passes through the layers to it)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, **kwargs: Any) -> Any:
        mask = kwargs.pop(MASK_KWARG, None)
        if mask is None:
            raise ValueError(
                "a Higgs Audio step without an audio mask: its requests need a HiggsSpeech extension"
            )
        kwargs.pop("attention_mask", None)
        kwargs.pop("use_cache", None)
        hidden = inputs_embeds
        rope = self.model.rotary_emb(hidden, position_ids)
        for layer in self.model.layers:
            hidden = layer(
                hidden,
                position_embeddings=rope,
                attention_mask=None,
                audio_token_mask=mask,
                position_ids=position_ids,
                **kwargs,
            )
        return types.SimpleNamespace(last_hidden_state=self.model.norm(hidden))


@dataclasses.dataclass
class HiggsTalker(LoadedModel):
    """The AR engine's parts (embed = the text embedding, decoder = `HiggsDecoder`, head = the audio head)
    and what prompts and the hook need."""

    audio_embed: nn.Module | None = None  # HiggsAudioV2Embeddings: [N, K] codes → [N, H] summed
    higgs_config: Any = None
    generation_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    model_dir: str = ""
    _processor: Any = None

    def processor(self) -> Any:
        """The checkpoint's `HiggsAudioV2Processor` (its tokenizer, chat template and codec, whose encoder
        turns a voice clip into prompt frames), loaded on first use."""
        if self._processor is None:
            from transformers import AutoProcessor

            self._processor = AutoProcessor.from_pretrained(self.model_dir)
        return self._processor

    def frame_rows(self, codes: torch.Tensor) -> torch.Tensor:
        return self.audio_embed(codes.to(self.embed.weight.device))


@torch.inference_mode()
def load_talker(model_dir: str, dtype: torch.dtype, device: str) -> HiggsTalker:
    """The AR engine's `model_loader` for a Higgs Audio v2 checkpoint directory."""
    from transformers import HiggsAudioV2ForConditionalGeneration

    model = HiggsAudioV2ForConditionalGeneration.from_pretrained(
        model_dir, dtype=dtype, attn_implementation=ATTENTION_NAME
    )
    model.to(device).eval()
    config = model.config
    return HiggsTalker(
        embed=model.model.embed_tokens,
        decoder=HiggsDecoder(model.model),
        head=model.audio_lm_head,
        config=config,
        tokenizer=load_tokenizer(model_dir),
        eos_token_ids=[],  # the all-EOS frame ends a request (frame_codes), as the reference's EOS token
        root=model,
        audio_embed=model.model.embed_audio_tokens,
        higgs_config=config,
        generation_config=model.generation_config.to_dict(),
        model_dir=str(model_dir),
    )


def speech_state(config: Any, prompt_ids: list[int], params: Any = None) -> HiggsSpeech:
    """A request's `HiggsSpeech` for `prompt_ids`: the delay pattern's start as the reference's processor
    computes it from the prompt's last `num_codebooks` tokens, and its sampling (greedy at temperature 0;
    else the request's temperature / top-k / top-p, seeded by its seed or a fresh one)."""
    k = config.num_codebooks
    delay = [i + 1 for i in range(k)]
    window = list(prompt_ids[-k:])
    bos = [0] * k
    if config.audio_bos_token_id in window:
        after = k - window.index(config.audio_bos_token_id)
        bos = [d - after for d in delay]
    eos = list(delay)
    if config.audio_delay_token_id in window:
        after = k - window.index(config.audio_delay_token_id)
        eos = [d - after for d in delay]
    return HiggsSpeech(
        spec=_spec(params),
        bos_delay=bos,
        eos_delay=eos,
        ends_with_delay=bool(prompt_ids) and prompt_ids[-1] == config.audio_delay_token_id,
        audio_ids=(config.audio_token_id, config.audio_delay_token_id),
    )


def prompt_inputs(
    model: HiggsTalker,
    ids: list[int],
    audio_codes: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> ARInputs:
    """The engine inputs of a prompt: where it holds audio (a voice reference the processor encoded, in its
    delay pattern: `audio_input_ids` [1, N, K] and `audio_input_ids_mask` [1, N]), the prompt's embeddings
    with its audio positions taking those frames' audio embeddings in order, as the reference's forward
    places them."""
    if audio_codes is None or audio_codes.numel() == 0:
        return ARInputs()
    frames = audio_codes[0] if audio_codes.dim() == 3 else audio_codes
    if valid is not None:
        frames = frames[valid.reshape(-1).bool()]
    config = model.higgs_config
    tokens = torch.tensor(ids, dtype=torch.long)
    where = (tokens == config.audio_token_id) | (tokens == config.audio_delay_token_id)
    if int(where.sum()) != len(frames):
        raise ValueError(f"the prompt has {int(where.sum())} audio positions for {len(frames)} audio frames")
    with torch.inference_mode():
        embeds = model.embed(tokens.to(model.embed.weight.device)).clone()
        embeds[where.to(embeds.device)] = model.frame_rows(frames).to(embeds.dtype)
    return ARInputs(inputs_embeds=embeds.cpu())


def _spec(params: Any) -> dict[str, Any] | None:
    if params is None or getattr(params, "temperature", 1.0) == 0.0:
        return None
    seed = getattr(params, "seed", None)
    return {
        "temperature": float(params.temperature),
        "top_k": int(params.top_k) if params.top_k and params.top_k > 0 else 0,
        "top_p": float(params.top_p),
        "seed": int(seed) if seed is not None else random.getrandbits(62),
    }


def frame_codes(model: HiggsTalker, step: SampledStep) -> PostSample:
    """Post-sample hook: every codebook of each sampled frame, the token it appends, its audio embedding and
    the stop (the all-EOS frame)."""
    config = model.higgs_config
    k, v = config.num_codebooks, config.codebook_size
    bos_id, eos_id = config.audio_stream_bos_id, config.audio_stream_eos_id
    states = [_state(inputs) for inputs in step.inputs]
    logits = model.head(step.hidden.to(model.head.weight.dtype)).float().reshape(-1, k, v)
    device = logits.device
    prev_delay = []
    delay_id = config.audio_delay_token_id
    for state, t, past in zip(states, step.steps, step.histories, strict=True):
        # the step whose frame first held a stream EOS: the first delay token the sequence appended
        first = next((j for j, token in enumerate(past) if token == delay_id), None)
        # the delay tokens the reference's processor has seen as the last token, this call included
        seen = int(state.ends_with_delay) + (max(0, t - first) if first is not None else 0)
        prev = state.ends_with_delay if t == 0 else first is not None and first <= t - 1
        prev_delay.append(prev)
        bos = torch.tensor(state.bos_delay, device=device) - t >= 0
        eos = torch.tensor(state.eos_delay, device=device) - seen <= 0
        row = logits[len(prev_delay) - 1]
        row[bos] = row[bos].masked_fill(torch.arange(v, device=device) != bos_id, float("-inf"))
        row[eos] = row[eos].masked_fill(torch.arange(v, device=device) != eos_id, float("-inf"))
    specs = [state.spec for state in states]
    pick = SeededPick(specs, step.steps, device)
    frames = torch.stack([pick(j, logits[:, j]) for j in range(k)], dim=1)
    has_eos = (frames == eos_id).any(dim=1)
    all_eos = (frames == eos_id).all(dim=1)
    tokens = torch.full_like(step.token_ids, config.audio_token_id)
    tokens[has_eos | torch.tensor(prev_delay, device=device)] = config.audio_delay_token_id
    tokens[all_eos] = config.eos_token_id
    next_embeds = model.frame_rows(frames)
    return PostSample(frames=frames, token_ids=tokens, next_embeds=next_embeds, stop=all_eos)


def _state(inputs: Any) -> HiggsSpeech:
    extension = getattr(inputs, "extension", None)
    if not isinstance(extension, HiggsSpeech):
        raise ValueError("a Higgs Audio request needs ARInputs.extension = HiggsSpeech (talker.speech_state)")
    return extension


def audio_mask(batch: list[Any], offsets: list[int], total: int, device: torch.device) -> dict[str, Any]:
    """Extra-input builder: [1, T] True where the step's token is an audio position (the audio token or the
    delay token, as the reference's placeholder mask; every generated position is one)."""
    ids = next(
        item.seq.request.inputs.extension.audio_ids
        for item in batch
        if isinstance(item.seq.request.inputs.extension, HiggsSpeech)
    )
    tokens: list[int] = []
    for item in batch:
        tokens.extend(item.seq.token_ids[item.start : item.start + item.num_tokens])
    flat = torch.tensor(tokens, dtype=torch.long)
    mask = (flat == ids[0]) | (flat == ids[1])
    return {MASK_KWARG: mask[None].to(device)}


def register() -> None:
    register_extra_input(HiggsSpeech, audio_mask)
