"""Sesame CSM: a speaker-tagged turn of text, after the conversation's earlier turns (text and audio) →
backbone codes (32 codebooks a frame at 12.5 Hz) → 24 kHz waveform.

Stage 0, the backbone, runs on the AR engine, its depth decoder in the post-sample hook (backbone.py); stage
1, Mimi's decoder, on the generation engine (codec.py): async chunks decoded as a stream as they come, full
handoff in one pass as the reference.

A request speaks as speaker `voice` ("0", "1") or `speaker_id`; its context is the conversation so far, as the
reference's chat template renders it (each earlier turn "[speaker]text" then its audio's frames): an uploaded
voice (its clip and transcript, `ref_text`, as a turn by the same speaker), a request's own clip (`ref_audio`
with `ref_text`), and `context`, a list of turns {speaker, text, audio}. Clips are encoded by Mimi's encoder
in the backbone stage (cached per clip).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec
import torch

from omnistage.config.capabilities import Capabilities, SpeechOption
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.families.shared.speech_fields import speech_fields
from omnistage.outputs import StageOutput, TokenCounts
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.generation.engine import stream_frames
from omnistage.stages.generation.generation_inputs import GenerationInputs

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py
_MODELS = "omnistage.families.csm"
ARCHITECTURE = "CsmForConditionalGeneration"
SAMPLE_RATE = 24000
SPEAKERS = ("0", "1")  # the voices it lists; any speaker id through `speaker_id`
BOS, EOS, AUDIO, AUDIO_EOS = "<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>"
MAX_CONTEXT_TURNS = 16
SpeakerId = Annotated[int, msgspec.Meta(ge=0, le=999)]
Text = Annotated[str, msgspec.Meta(max_length=4096)]


class ContextTurn(TypedDict, total=False):
    """An earlier turn of the conversation: who spoke, what they said, and how it sounded."""

    speaker: SpeakerId
    text: Text
    audio: str  # a data URL or an allowed local path (read by the server: its bytes reach the stage)


SPEECH_OPTIONS = (
    SpeechOption("speaker_id", SpeakerId, "the speaker the new turn is spoken by (the [n] tag)"),
    SpeechOption("ref_audio", str, "a clip of the speaker, spoken before as context", media=True),
    SpeechOption("ref_text", Text, "what ref_audio (or the uploaded voice) says"),
    SpeechOption(
        "context",
        Annotated[list[ContextTurn], msgspec.Meta(max_length=MAX_CONTEXT_TURNS)],
        "the conversation's earlier turns, oldest first: {speaker, text, audio}",
        media="audio",
    ),
    SpeechOption(
        "initial_codec_chunk_frames",
        Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)],
        "codec frames in the first audio chunk",
    ),
)
# The reference generate's defaults (csm-1b's generation_config: sampled, temperature 0.9, top-k 50); its
# only stops are the all-EOS frame and the length.
BACKBONE_DEFAULTS = {"temperature": 0.9, "top_k": 50, "max_tokens": 2048}


def _speaker(fields: dict[str, Any]) -> int:
    """The new turn's speaker: `speaker_id`, else a listed voice's number, else 0 (an uploaded voice)."""
    voice, chosen = fields.get("speaker"), fields.get("speaker_id")
    listed = voice is not None and fields.get("uploaded_voice") is None
    if listed and chosen is not None and str(chosen) != voice:
        raise InvalidRequestError(
            f"speaker_id: {chosen} contradicts voice {voice!r}; give one of them", param="speaker_id"
        )
    if chosen is not None:
        return int(chosen)
    if listed:
        if not str(voice).isdigit():
            raise InvalidRequestError(
                f"voice: {voice!r} is not a speaker id ({', '.join(SPEAKERS)})", param="voice"
            )
        return int(voice)
    return 0


def context_turns(fields: dict[str, Any], speaker: int) -> list[dict[str, Any]]:
    """The earlier turns, oldest first: `context`, then the uploaded voice or `ref_audio` (the speaker's own
    clip, the turn just before the new one). Each: speaker, text, clip (bytes or a voice file)."""
    turns = []
    for i, turn in enumerate(fields.get("context") or []):
        for key in ("speaker", "text", "audio"):
            if turn.get(key) in (None, ""):
                raise InvalidRequestError(f"context[{i}].{key}: required", param=f"context[{i}].{key}")
        turns.append({"speaker": int(turn["speaker"]), "text": turn["text"], "clip": {"data": turn["audio"]}})
    uploaded, inline = fields.get("uploaded_voice"), fields.get("ref_audio")
    if uploaded is not None and inline is not None:
        raise InvalidRequestError(
            "ref_audio: give ref_audio or an uploaded voice, not both", param="ref_audio"
        )
    if inline is not None:
        if not fields.get("ref_text"):
            raise InvalidRequestError("ref_text: ref_audio needs its transcript", param="ref_text")
        turns.append({"speaker": speaker, "text": fields["ref_text"], "clip": {"data": inline}})
    elif uploaded is not None:
        text = fields.get("ref_text") or uploaded.get("ref_text")
        if not text:
            raise InvalidRequestError(
                f"voice: uploaded voice {uploaded['name']!r} has no transcript (ref_text); CSM speaks in a "
                "voice by hearing it say something known",
                param="voice",
            )
        turns.append({"speaker": speaker, "text": text, "clip": {"path": uploaded["path"]}})
    elif fields.get("ref_text") is not None:
        raise InvalidRequestError("ref_text: needs a clip (ref_audio or an uploaded voice)", param="ref_text")
    return turns


def clip_codes(loaded: Any, clip: dict[str, Any], param: str) -> torch.Tensor:
    """A clip's Mimi codes [T, K], as the reference's processor and `generate` make them (24 kHz mono,
    encoded whole); cached on the loaded model per clip (its bytes' hash, or its file's path and mtime)."""
    import numpy as np

    from omnistage.media import decode_audio, resample, voice_samples

    cache = loaded.__dict__.setdefault("clip_codes", {})
    if "data" in clip:
        data = clip["data"]
        if not isinstance(data, bytes | bytearray) or not data:
            raise InvalidRequestError(f"{param}: needs the bytes of an audio clip", param=param)
        key: tuple = ("data", hashlib.sha256(data).hexdigest())
    else:
        stat = os.stat(clip["path"])
        key = (clip["path"], stat.st_mtime_ns, stat.st_size)
    if key not in cache:
        try:
            samples, rate = (
                decode_audio(bytes(clip["data"])) if "data" in clip else voice_samples(clip["path"])
            )
        except Exception as exc:  # whatever the decoder makes of bytes that are not audio
            raise InvalidRequestError(f"{param}: not a readable audio clip ({exc})", param=param) from None
        samples = samples.mean(axis=0) if samples.ndim == 2 else samples
        if rate != SAMPLE_RATE:
            samples = resample(samples, rate, SAMPLE_RATE)
        if len(samples) == 0:
            raise InvalidRequestError(f"{param}: the clip is empty", param=param)
        codec = loaded.codec
        device, dtype = codec.device, codec.dtype
        values = torch.from_numpy(np.asarray(samples, dtype=np.float32)).to(device, dtype)[None, None]
        with torch.inference_mode():
            codes = codec.encode(values).audio_codes  # [1, K, T]
        cache[key] = codes[0].T.to("cpu", torch.long).contiguous()
    return cache[key]


def backbone_prompt(
    loaded: Any, text: str, speaker: int, turns: list[dict[str, Any]]
) -> tuple[list[int], Any]:
    """(prompt ids, ARInputs) as the reference's processor and `_merge_input_ids_with_input_values` make
    them: each turn "<bos>[speaker]text<eos>", an earlier turn's audio frames after it (summed codebook
    embeddings) and an all-EOS frame; text positions embed as text. Without audio the prompt is plain ids
    (shareable through the prefix cache)."""
    tokenizer = loaded.tokenizer
    pieces, clips = [], []
    for i, turn in enumerate(turns):
        codes = clip_codes(loaded, turn["clip"], f"context[{i}].audio" if "data" in turn["clip"] else "voice")
        pieces.append(f"{BOS}[{turn['speaker']}]{turn['text']}{EOS}{AUDIO * len(codes)}{AUDIO_EOS}")
        clips.append(codes)
    pieces.append(f"{BOS}[{speaker}]{text}{EOS}")
    ids = tokenizer("".join(pieces), add_special_tokens=False)["input_ids"]
    if not clips:
        return ids, None
    config = loaded.csm_config
    with torch.inference_mode():
        rows = loaded.text_rows(ids)
        index = torch.tensor(ids)
        rows[index == config.audio_token_id] = loaded.frame_rows(torch.cat(clips)).to(rows.dtype)
        eos_frame = torch.full((1, config.num_codebooks), config.codebook_eos_token_id, dtype=torch.long)
        rows[index == config.audio_eos_token_id] = loaded.frame_rows(eos_frame).to(rows.dtype)
    return ids, ARInputs(inputs_embeds=rows)


def speech_input(ctx: StageInputContext) -> StageRequest:
    """The speech route's prompt → the backbone's prompt (and the depth decoder's sampling)."""
    from omnistage.families.csm.backbone import depth_sampling

    loaded = ctx.resources
    fields = speech_fields(ctx.prompt)
    text = str(fields.get("input") or "")
    if not text.strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")
    if fields.get("instructions"):
        raise InvalidRequestError(
            "instructions: CSM takes no instructions; give context", param="instructions"
        )
    speaker = _speaker(fields)
    turns = context_turns(fields, speaker)
    ids, inputs = backbone_prompt(loaded, text, speaker, turns)
    inputs = inputs or ARInputs()
    inputs.extension = depth_sampling(loaded, ctx.params)
    audio = ids.count(loaded.csm_config.audio_token_id)  # the context clips' frames
    counts = TokenCounts(input_text_tokens=len(ids) - audio, input_audio_tokens=audio)
    return StageRequest(ctx.request_id, prompt=ids, params=ctx.params, inputs=inputs, token_counts=counts)


def _frames(codes: torch.Tensor | None, eos: int) -> torch.Tensor:
    """The backbone's frames up to its all-EOS frame (the reference decodes up to the first one)."""
    if codes is None:
        return torch.empty((0, 0), dtype=torch.long)
    ended = (codes == eos).all(dim=1).nonzero()
    return codes[: int(ended[0])] if len(ended) else codes


def _codec_request(ctx: StageInputContext, frames: torch.Tensor, streaming: bool) -> StageRequest:
    inputs = GenerationInputs(frames)
    first = speech_fields(ctx.prompt).get("initial_codec_chunk_frames")
    if first is not None:  # this request's first chunk (time to first audio), else the stage's by load
        inputs.first_chunk_frames = int(first)
    return StageRequest(ctx.request_id, params=ctx.params, inputs=inputs, streaming_input=streaming)


def codec_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: the backbone's finished frames."""
    return _codec_request(ctx, _frames(ctx.upstream[0].codes, _eos(ctx)), streaming=False)


def codec_chunk(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: each step's new frames as they come."""
    frames = _frames(chunk.codes, _eos(ctx))
    return stream_frames(ctx, frames, last, lambda part: _codec_request(ctx, part, True))


def _eos(ctx: StageInputContext) -> int:
    return int(ctx.resources.codebook_eos_token_id)  # the codec stage's generator (codec.py)


def checkpoint_speakers(model_dir: str) -> list[str]:
    return list(SPEAKERS)


CSM = PipelineSpec(
    name="csm",
    stages=(
        StageSpec(
            stage_id=0,
            name="backbone",
            kind=StageKind.AR,
            input_processor=speech_input,
            sampling_constraints={"detokenize": False},
            default_params=BACKBONE_DEFAULTS,
            engine_args={
                "model_loader": f"{_MODELS}.backbone:load_backbone",
                "post_sample_hook": f"{_MODELS}.backbone:depth_codes",
            },
        ),
        StageSpec(
            stage_id=1,
            name="codec",
            kind=StageKind.GENERATION,
            inputs=(0,),
            final_output=True,
            output_modality="audio",
            input_processor=codec_input,
            chunk_processor=codec_chunk,
            engine=f"{_MODELS}.codec:create_engine",
        ),
    ),
    architectures=(ARCHITECTURE,),
    default_deploy=str(HERE / "csm.yaml"),
    family=FAMILY,
    capabilities=Capabilities(
        routes=("speech",),
        prompt="speech",
        fields={"sampling": (0,), "generation": (1,)},
        voices_of=f"{_MODELS}.pipeline:checkpoint_speakers",
        clones_voices=True,
        speech_options=SPEECH_OPTIONS,
    ),
)
