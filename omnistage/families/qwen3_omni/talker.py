"""The Qwen3-Omni talker's inputs, built from the thinker's output exactly as
`Qwen3OmniMoeForConditionalGeneration.generate` builds them, and its per-step hooks.

With thinker prompt ids p (L of them) and generated tokens g_0..g_{G-1}, writing T(x) for
`talker.text_projection` of the thinker's token embedding, H(i) for `talker.hidden_projection` of the
thinker's hidden layer `accept_hidden_layer` at position i and C(c) for the talker's codec embedding:

- user part: every position of the prompt's user turns (from their `<|im_start|>` to the next one), T(p_i)
  for text and H(i) for audio/image/video placeholders (a text-only prompt needs no thinker hidden state);
- assistant part (9 rows): T of the 3 role tokens of the last `<|im_start|>assistant`, T(tts_pad) × 4,
  T(tts_bos), T(g_0), plus 0, 0, 0, C(nothink), C(think_bos), C(think_eos), C(speaker), C(pad), C(bos);
- text stream, one row added to each generated frame's embedding (the step hook): T(g_1) .. T(g_{G-2}),
  T(tts_eos), then T(tts_pad) for ever. The last thinker token is never spoken.

Each talker step samples codebook 0; the post-sample hook runs the code predictor (batched over the step's
sequences) for codebooks 1..15 and feeds back the sum of the 16 codebook embeddings; the step hook adds the
text row. Async chunk: the prompt is fixed once the thinker has two tokens out and text row j once g_{j+2}
is (which proves g_{j+1} is not the last); the step-ready hook holds frame j back until row j is there.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.families.qwen2_5_omni.talker import new_reply_rows
from omnistage.families.qwen3_tts.talker_inputs import TalkerText
from omnistage.families.shared.depth_codes import residual_codes
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.post_sample import PostSample, SampledStep

DEFAULT_SPEAKER = "Ethan"  # the reference generate's default


def speaker_id(loaded: Any, speaker: str) -> int:
    speakers = loaded.talker.config.speaker_id or {}
    if speaker.lower() not in speakers:
        raise InvalidRequestError(
            f"unknown speaker {speaker!r}; this model has {sorted(speakers)}", param="speaker"
        )
    return int(speakers[speaker.lower()])


def _text_rows(loaded: Any, ids: list[int]) -> torch.Tensor:
    device = loaded.embed.weight.device
    return loaded.talker.text_projection(
        loaded.text_embed(torch.tensor(ids, dtype=torch.long, device=device))
    )


def _user_positions(config: Any, ids: list[int]) -> list[int]:
    """Prompt positions inside user turns (the role is the token after the latest `<|im_start|>`)."""
    role, out = None, []
    for i, token in enumerate(ids):
        if token == config.im_start_token_id:
            role = ids[i + 1] if i + 1 < len(ids) else None
        if role == config.user_token_id:
            out.append(i)
    return out


def _assistant_start(config: Any, ids: list[int]) -> int:
    starts = [
        i
        for i in range(len(ids) - 1)
        if ids[i] == config.im_start_token_id and ids[i + 1] == config.assistant_token_id
    ]
    if not starts:
        raise InvalidRequestError("the prompt has no assistant turn for the talker to speak", param="prompt")
    return starts[-1]


@torch.inference_mode()
def talker_prompt(
    loaded: Any,
    prompt_ids: list[int],
    generated: list[int],
    hidden: torch.Tensor | None,
    speaker: str,
    rope: dict[str, Any] | None = None,
    finished: bool = True,
) -> tuple[list[int], ARInputs]:
    """(placeholder prompt ids, the AR engine's inputs). `hidden`: the thinker's `accept_hidden_layer` rows
    (needed only when the prompt has audio/image/video placeholders); `rope`: the multimodal RoPE inputs
    (audio feature lengths, image/video grids) the thinker passed on."""
    talker, config = loaded.talker, loaded.omni_config
    cfg = talker.config
    if len(generated) < 2:
        raise InvalidRequestError(
            f"the thinker produced {len(generated)} token(s); the talker needs at least 2 to speak",
            param="max_tokens",
        )
    spk = speaker_id(loaded, speaker)
    device = loaded.embed.weight.device
    user = _user_positions(config, prompt_ids)
    user_ids = [prompt_ids[i] for i in user]
    media = {cfg.audio_token_id, cfg.image_token_id, cfg.video_token_id}
    rows = _text_rows(loaded, user_ids) if user_ids else torch.empty(0, cfg.text_config.hidden_size)
    mm = [k for k, t in enumerate(user_ids) if t in media]
    if mm:
        if hidden is None:
            raise ValueError("a prompt with audio/image/video needs the thinker's hidden layer")
        picked = hidden[[user[k] for k in mm]].to(device, rows.dtype)
        rows[mm] = talker.hidden_projection(picked)
    start = _assistant_start(config, prompt_ids)
    role = _text_rows(loaded, prompt_ids[start : start + 3])
    pad, bos, eos = _text_rows(
        loaded, [config.tts_pad_token_id, config.tts_bos_token_id, config.tts_eos_token_id]
    )
    text = torch.cat([role, pad.expand(4, -1), bos[None], _text_rows(loaded, generated[:1])])
    codec_ids = [cfg.codec_nothink_id, cfg.codec_think_bos_id, cfg.codec_think_eos_id, spk]
    codec_ids += [cfg.codec_pad_id, cfg.codec_bos_id]
    codec = loaded.embed(torch.tensor(codec_ids, device=device))
    assistant = text + torch.cat([torch.zeros_like(codec[:3]), codec])
    inputs = ARInputs(
        inputs_embeds=torch.cat([rows.to(assistant.dtype), assistant]),
        extension=TalkerText(text_stream_rows(loaded, generated, 0, finished), pad),
    )
    n = inputs.inputs_embeds.shape[0]
    rope = {k: torch.tensor(v, device=device) for k, v in (rope or {}).items() if v is not None}
    if rope:  # as the reference: multimodal positions only when the request has audio or vision inputs
        talker_ids = torch.tensor([user_ids + [config.tts_pad_token_id] * assistant.shape[0]], device=device)
        positions, delta = talker.get_rope_index(
            talker_ids,
            rope.get("image_grid_thw"),
            rope.get("video_grid_thw"),
            torch.ones_like(talker_ids),
            False,
            rope.get("audio_feature_lengths"),
            rope.get("video_second_per_grid"),
        )
        inputs.position_ids = positions[:, 0].cpu()
        inputs.rope_delta = int(delta.reshape(-1)[0])
    return [cfg.codec_pad_id] * n, inputs


@torch.inference_mode()
def text_stream_rows(loaded: Any, generated: list[int], start: int, finished: bool) -> torch.Tensor:
    """Text rows `start`.. that the thinker's output so far determines: T(g_{j+1}) for j < G - 2, then
    T(tts_eos) once the thinker has finished."""
    count = new_reply_rows(len(generated), start)
    ids = generated[1 + start : 1 + start + count]
    if finished:
        ids = ids + [loaded.omni_config.tts_eos_token_id]
    width = loaded.embed.weight.shape[1]
    return _text_rows(loaded, ids) if ids else torch.empty(0, width, dtype=loaded.embed.weight.dtype)


def predict_codes(model: Any, step: SampledStep) -> PostSample:
    """Post-sample hook: codebooks 1..15 of every sampled frame in one batch (greedy, as the reference's
    greedy generate), and the sum of the 16 codebook embeddings to feed back."""
    predictor = model.talker.code_predictor
    code0 = model.embed(step.token_ids)
    codes, rest = residual_codes(
        predictor.model,
        predictor.lm_head,
        predictor.model.codec_embedding,
        step.hidden.to(code0.dtype),
        code0,
    )
    return PostSample(codes=codes, next_embeds=code0 + rest)


def add_text_row(inputs: ARInputs, step: int, embed: torch.Tensor) -> torch.Tensor:
    """The step hook: frame `step` is fed back with text row `step` (tts_pad once the text is spoken)."""
    text = inputs.extension
    rows = text.trailing_text
    row = rows[step] if step < rows.shape[0] else text.tts_pad_embed
    return embed + row.to(embed.dtype)


def text_row_ready(inputs: ARInputs, step: int) -> bool:
    """The step-ready hook: row `step` is there, or the text is complete (its pad repeats)."""
    return inputs.input_finished or step < inputs.extension.trailing_text.shape[0]
