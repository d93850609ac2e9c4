"""The talker's prompt for one request, assembled as the reference's
`Qwen3TTSForConditionalGeneration.generate` assembles it (CustomVoice, VoiceDesign, Base's x-vector-only
voice clone, and Base's in-context clone: the clip's transcript and codes in the prompt, as its
`generate_icl_prompt`).

`input_ids` is the chat-wrapped text `<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`
(the first 3 and last 5 ids are the wrapper), `instruct_ids` the optional `<|im_start|>user\\n{instruct}...`.
Writing T(ids) for projected text embeddings and C(ids) for codec embeddings, the rows are
  T(instruct) | T(role) | T(pad)… + C(think prefix) [, speaker] , T(bos) + C(pad) | text part | …
with the text either all in the prompt (non-streaming: T(text), T(eos) over C(pad), then T(pad) + C(bos))
or one token per generated frame (streaming: T(text[0]) + C(bos) in the prompt, the rest + T(eos) fed with
the frames). The rows still to feed are `TalkerText.trailing_text`, then `tts_pad_embed` for ever.
In-context, the text part is T(ref text + text), T(eos) against C(bos), F(clip codes) (F: a frame's 16
codebook embeddings summed), either one after the other (non-streaming) or summed row by row (streaming).
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.families.qwen3_tts.talker_inputs import TalkerText
from omnistage.stages.ar.ar_inputs import ARInputs

ROLE, TAIL = 3, 5  # wrapper ids before and after the text in input_ids


@torch.inference_mode()
def talker_prompt(
    loaded: Any,
    input_ids: list[int],
    instruct_ids: list[int] | None = None,
    language: str = "auto",
    speaker: str | None = None,
    non_streaming: bool = True,
    speaker_embed: torch.Tensor | None = None,
    ref_ids: list[int] | None = None,
    ref_codes: torch.Tensor | None = None,
) -> tuple[list[int], ARInputs]:
    """(placeholder prompt ids, the AR engine's inputs: inputs_embeds, and the text still to feed).
    `speaker_embed`: a cloned voice's x-vector (Base), in the preset speaker's place; `ref_ids` (the
    transcript wrapped as `<|im_start|>assistant\n{ref_text}<|im_end|>\n`) and `ref_codes` ([R, 16], the
    clip's codes): in-context cloning."""
    tts, cfg = loaded.tts_config, loaded.talker_config
    if len(input_ids) <= ROLE + TAIL:
        raise InvalidRequestError("the text to speak is empty", param="input")
    specials = [tts["tts_bos_token_id"], tts["tts_eos_token_id"], tts["tts_pad_token_id"]]
    bos, eos, pad = loaded.text_rows(specials)
    speaker_row = _speaker_row(loaded, speaker)
    if speaker_embed is not None:
        speaker_row = speaker_embed.to(bos.device, bos.dtype).reshape(-1)
    language_id = _language_id(cfg, language, speaker)
    if language_id is None:
        prefix = [cfg["codec_nothink_id"], cfg["codec_think_bos_id"], cfg["codec_think_eos_id"]]
    else:
        prefix = [cfg["codec_think_id"], cfg["codec_think_bos_id"], language_id, cfg["codec_think_eos_id"]]
    codec = [loaded.codec_rows(prefix)]
    if speaker_row is not None:
        codec.append(speaker_row[None])
    codec.append(loaded.codec_rows([cfg["codec_pad_id"], cfg["codec_bos_id"]]))
    codec = torch.cat(codec)
    n = codec.shape[0]
    rows = [loaded.text_rows(input_ids[:ROLE]), torch.cat([pad.expand(n - 2, -1), bos[None]]) + codec[:-1]]
    if instruct_ids:
        rows.insert(0, loaded.text_rows(instruct_ids))
    text = input_ids[ROLE:-TAIL]
    if ref_codes is not None:
        if not ref_ids or len(ref_ids) <= ROLE + 2:
            raise InvalidRequestError("ref_text: in-context cloning needs a transcript", param="ref_text")
        spoken = torch.cat([loaded.text_rows(ref_ids[ROLE:-2] + text), eos[None]])
        frames = torch.cat([loaded.codec_rows([cfg["codec_bos_id"]]), _frame_rows(loaded, ref_codes)])
        if non_streaming:
            rows.append(spoken + loaded.codec_rows([cfg["codec_pad_id"]] * spoken.shape[0]))
            rows.append(frames + pad)
            trailing = pad[None]
        elif spoken.shape[0] > frames.shape[0]:
            rows.append(spoken[: frames.shape[0]] + frames)
            trailing = spoken[frames.shape[0] :]
        else:
            rows.append(torch.cat([spoken, pad.expand(frames.shape[0] - spoken.shape[0], -1)]) + frames)
            trailing = pad[None]
    elif non_streaming:
        spoken = torch.cat([loaded.text_rows(text), eos[None]])
        rows.append(spoken + loaded.codec_rows([cfg["codec_pad_id"]] * (len(text) + 1)))
        rows.append(pad[None] + loaded.codec_rows([cfg["codec_bos_id"]]))
        trailing = pad[None]
    else:
        rows.append(loaded.text_rows(text[:1]) + codec[-1:])
        trailing = torch.cat([loaded.text_rows(text[1:]), eos[None]])
    embeds = torch.cat(rows)
    inputs = ARInputs(inputs_embeds=embeds, extension=TalkerText(trailing, pad))
    return [cfg["codec_pad_id"]] * embeds.shape[0], inputs


def _frame_rows(loaded: Any, codes: torch.Tensor) -> torch.Tensor:
    """F(codes): each [16] frame's codebook embeddings summed (the talker's for codebook 0, the code
    predictor's for the others), as the talker is fed its own generated frames."""
    codes = codes.to(loaded.embed.weight.device, torch.long)
    tables = [loaded.embed, *loaded.code_predictor.model.codec_embedding]
    return torch.stack([table(codes[:, j]) for j, table in enumerate(tables)], dim=1).sum(1)


def _speaker_row(loaded: Any, speaker: str | None) -> torch.Tensor | None:
    if not speaker:
        return None
    speakers = loaded.talker_config.get("spk_id") or {}
    if speaker.lower() not in speakers:
        raise InvalidRequestError(
            f"unknown voice {speaker!r}; this model has {sorted(speakers) or 'no preset voices'}",
            param="voice",
        )
    spk = speakers[speaker.lower()]
    return loaded.codec_rows(spk if isinstance(spk, list) else [spk])[0]


def _language_id(cfg: dict[str, Any], language: str, speaker: str | None) -> int | None:
    ids = cfg.get("codec_language_id") or {}
    lang = (language or "auto").lower()
    if lang != "auto" and (lang not in ids or "dialect" in lang):
        names = ["Auto", *sorted(k.capitalize() for k in ids if "dialect" not in k)]
        raise InvalidRequestError(f"unsupported language {language!r}; one of {names}", param="language")
    language_id = None if lang == "auto" else ids[lang]
    dialect = (cfg.get("spk_is_dialect") or {}).get((speaker or "").lower())
    if lang in ("chinese", "auto") and dialect:
        language_id = ids[dialect]
    return language_id
