"""The talker's inputs, built from the thinker's output exactly as the composite
`Qwen2_5OmniForConditionalGeneration.generate` builds them, and the per-step hook that feeds the talker the
thinker's reply one token at a time.

With L prompt tokens and G generated thinker tokens g_0..g_{G-1}, the thinker produced hidden states for
L + G - 1 positions (the last token is never fed back). Writing e(t) for the thinker's token embedding and
h_i for its last-layer hidden state at position i:

- prompt ids: `codec_mask` × L, `codec_pad`, `codec_bos` (what repetition penalty sees);
- prompt embeddings (thinker width, projected by the talker's decoder):
  rows 0..L-1  e(prompt) with audio/image/video placeholders zeroed, + h_0..h_{L-1}
  row L        e(speaker bos) + codec_embed(pad)
  row L+1      e(g_0) + h_L + codec_embed(bos)
- positions: the thinker's prompt positions continued by two text positions; the same rope delta;
- reply stream, one row added to each generated codec token's embedding (the step hook):
  e(g_1) + h_{L+1}, ..., e(g_{G-2}) + h_{L+G-2}, e(text_eos), e(text_pad), then e(text_pad) for ever.

Async chunk: the talker need not wait for the whole reply. Its prompt is fixed once the thinker has two
tokens out, and reply row j once g_{j+2} is; the talker's step-ready hook holds codec token j back until
row j has arrived, so it computes exactly what it would have computed after the thinker had finished.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.stages.ar.ar_inputs import ARInputs


@dataclasses.dataclass
class ThinkerReply:
    """The talker request's extension (ARInputs.extension): the reply stream's rows so far [R, H]; streamed
    chunks append rows."""

    rows: torch.Tensor


@torch.inference_mode()
def talker_prompt(
    loaded: Any,
    prompt_ids: list[int],
    generated: list[int],
    hidden: torch.Tensor,
    speaker: str,
    mrope_positions: torch.Tensor | None = None,
    rope_delta: int = 0,
    finished: bool = True,
) -> tuple[list[int], ARInputs]:
    """(talker prompt ids, the AR engine's inputs).

    With `finished=False` the thinker is still writing (async chunk): the prompt is the same, and the reply
    stream holds the rows its output so far determines; `talker_reply_rows` makes the rest as it arrives."""
    talker, embed_text, embed_codec = loaded.talker, loaded.text_embed, loaded.embed
    n_prompt, n_gen = len(prompt_ids), len(generated)
    if n_gen < 2:
        raise InvalidRequestError(
            f"the thinker produced {n_gen} token(s); the talker needs at least 2 to speak", param="max_tokens"
        )
    if speaker not in loaded.speakers:
        raise InvalidRequestError(
            f"unknown speaker {speaker!r}; this model has {sorted(loaded.speakers)}", param="speaker"
        )
    _check_hidden(hidden, n_prompt, n_gen)
    device, dtype = embed_codec.weight.device, embed_codec.weight.dtype
    hidden = hidden.to(device, dtype)
    ids = torch.tensor(prompt_ids, device=device)
    config = talker.config
    placeholders = (ids == config.audio_token_index) | (ids == config.image_token_index)
    placeholders |= ids == config.video_token_index
    prompt_embeds = embed_text(ids).masked_fill(placeholders[:, None], 0.0) + hidden[:n_prompt]

    def codec(token: int) -> torch.Tensor:
        return embed_codec(torch.tensor([token], device=device))[0]

    first_reply = embed_text(torch.tensor(generated[:1], device=device))[0] + hidden[n_prompt]
    first_rows = torch.stack(
        [
            _text_row(loaded, loaded.speakers[speaker]) + codec(talker.codec_pad_token),
            first_reply + codec(talker.codec_bos_token),
        ]
    )
    inputs = ARInputs(
        inputs_embeds=torch.cat([prompt_embeds, first_rows]),
        extension=ThinkerReply(talker_reply_rows(loaded, generated, hidden[n_prompt + 1 :], 0, finished)),
    )
    if mrope_positions is not None:
        positions = torch.as_tensor(mrope_positions)
        tail = positions.max() + 1 + torch.arange(2)
        inputs.position_ids = torch.cat([positions, tail.expand(positions.shape[0], -1)], dim=1)
        inputs.rope_delta = int(rope_delta)
    codec_ids = [talker.codec_mask_token] * n_prompt + [talker.codec_pad_token, talker.codec_bos_token]
    return codec_ids, inputs


@torch.inference_mode()
def talker_reply_rows(
    loaded: Any, generated: list[int], new_hidden: torch.Tensor, start: int, finished: bool
) -> torch.Tensor:
    """Rows `start`.. of the reply stream that the thinker's output so far determines, given the hidden
    states they use (`new_hidden` = h_{L+1+start} .. h_{L+G-2}, G tokens out so far).

    Row j is e(g_{j+1}) + h_{L+j+1}. Its hidden state exists once g_{j+1} has been fed back, i.e. once
    g_{j+2} is out, which also proves g_{j+1} is not the last token (the last one is never fed back and
    gets no row). A finished thinker's stream ends with e(text_eos) and e(text_pad)."""
    count = new_reply_rows(len(generated), start)
    if new_hidden.shape[0] != count:
        raise ValueError(f"expected {count} new thinker hidden rows, got {new_hidden.shape[0]}")
    device, dtype = loaded.embed.weight.device, loaded.embed.weight.dtype
    ids = torch.tensor(generated[1 + start : 1 + start + count], dtype=torch.long, device=device)
    rows = loaded.text_embed(ids) + new_hidden.to(device, dtype)
    if finished:
        talker = loaded.talker
        ends = [_text_row(loaded, talker.text_eos_token), _text_row(loaded, talker.text_pad_token)]
        rows = torch.cat([rows, torch.stack(ends)])
    return rows


def new_reply_rows(num_generated: int, start: int) -> int:
    """How many reply rows past the first `start` the thinker's first `num_generated` tokens determine (and
    so how many of its newest hidden states they use): rows 0 .. num_generated - 3."""
    return max(0, num_generated - 2 - start)


def _text_row(loaded: Any, token: int) -> torch.Tensor:
    return loaded.text_embed(torch.tensor([token], device=loaded.embed.weight.device))[0]


def _check_hidden(hidden: torch.Tensor | None, n_prompt: int, n_gen: int) -> None:
    if hidden is None or hidden.shape[0] != n_prompt + n_gen - 1:
        rows = None if hidden is None else hidden.shape[0]
        raise ValueError(f"expected {n_prompt + n_gen - 1} thinker hidden rows, got {rows}")


def add_thinker_reply(inputs: ARInputs, step: int, embed: torch.Tensor) -> torch.Tensor:
    """The AR engine's step hook for the talker: generated codec token `step` is fed back with the
    thinker's reply row `step` added (the last row, text pad, repeats once the reply is spoken)."""
    reply = inputs.extension.rows
    return embed + reply[min(step, reply.shape[0] - 1)].to(embed.dtype)


def thinker_reply_ready(inputs: ARInputs, step: int) -> bool:
    """The AR engine's step-ready hook: row `step` is there, or the stream is complete (its pad repeats)."""
    return inputs.input_finished or step < inputs.extension.rows.shape[0]
