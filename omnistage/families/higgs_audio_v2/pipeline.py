"""Higgs Audio v2: text (with an optional scene description and a voice to clone) → talker frames (8
codebooks a frame at 25 Hz, in a delay pattern) → 24 kHz waveform.

Stage 0, the talker, runs on the AR engine with every codebook picked in its post-sample hook (talker.py);
stage 1, the codec's decoder, on the generation engine (codec.py): async chunks each decoded behind and ahead
of the decoder's receptive field, full handoff in one pass as the reference.

The prompt is what the reference's processor makes of the conversation its users write: a system turn, the
scene (`instructions` or `scene`) inside it, a voice to clone as an earlier exchange (the clip's transcript as
a user turn, the clip as the assistant's audio: encoded by the processor's codec, in the delay pattern), then
the text as the user's turn and the generation prompt ending in `<|audio_out_bos|>`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np
import torch

from omnistage.config.capabilities import Capabilities, SpeechOption
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.families.shared.speech_fields import speech_fields
from omnistage.outputs import StageOutput, TokenCounts
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.generation.engine import stream_frames
from omnistage.stages.generation.generation_inputs import GenerationInputs

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py
_MODELS = "omnistage.families.higgs_audio_v2"
ARCHITECTURE = "HiggsAudioV2ForConditionalGeneration"
SAMPLE_RATE = 24000
SYSTEM = "Generate audio following instruction."  # the released examples' system prompt
Text = Annotated[str, msgspec.Meta(max_length=4096)]

SPEECH_OPTIONS = (
    SpeechOption("ref_audio", str, "a clip of the voice to speak in", media=True),
    SpeechOption("ref_text", Text, "what ref_audio (or the uploaded voice) says"),
    SpeechOption("scene", Text, "the scene description (as `instructions`)"),
    SpeechOption("system", Text, f"the system prompt (default {SYSTEM!r})"),
    SpeechOption(
        "initial_codec_chunk_frames",
        Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)],
        "codec frames in the first audio chunk",
    ),
)
# The released generation_config's sampling (temperature 1.0, top-k 50, top-p 0.95); its stops are the
# all-EOS frame and the length.
TALKER_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 0.95, "max_tokens": 2048}


def conversation(text: str, system: str, scene: str | None, voice: tuple[str, np.ndarray] | None) -> list:
    """The messages as the released examples write them (a voice: its transcript, then its clip)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": [{"type": "text", "text": system}]}]
    if scene:
        messages.append({"role": "scene", "content": [{"type": "text", "text": scene}]})
    if voice is not None:
        messages.append({"role": "user", "content": [{"type": "text", "text": voice[0]}]})
        messages.append({"role": "assistant", "content": [{"type": "audio", "audio": voice[1]}]})
    messages.append({"role": "user", "content": [{"type": "text", "text": text}]})
    return messages


def _voice(fields: dict[str, Any]) -> tuple[str, np.ndarray] | None:
    """The voice to clone, (its transcript, its 24 kHz mono samples): `ref_audio` or an uploaded voice."""
    from omnistage.media import decode_audio, resample, voice_samples

    uploaded, inline = fields.get("uploaded_voice"), fields.get("ref_audio")
    if uploaded is not None and inline is not None:
        raise InvalidRequestError(
            "ref_audio: give ref_audio or an uploaded voice, not both", param="ref_audio"
        )
    if uploaded is None and inline is None:
        if fields.get("ref_text") is not None:
            raise InvalidRequestError(
                "ref_text: needs a clip (ref_audio or an uploaded voice)", param="ref_text"
            )
        return None
    text = fields.get("ref_text") or (uploaded or {}).get("ref_text")
    param = "ref_audio" if inline is not None else "voice"
    if not text:
        raise InvalidRequestError(
            f"{param}: a voice to clone needs its transcript (ref_text)", param="ref_text"
        )
    try:
        samples, rate = decode_audio(bytes(inline)) if inline is not None else voice_samples(uploaded["path"])
    except Exception as exc:  # whatever the decoder makes of bytes that are not audio
        raise InvalidRequestError(f"{param}: not a readable audio clip ({exc})", param=param) from None
    samples = samples.mean(axis=0) if samples.ndim == 2 else samples
    if rate != SAMPLE_RATE:
        samples = resample(samples, rate, SAMPLE_RATE)
    if len(samples) == 0:
        raise InvalidRequestError(f"{param}: the clip is empty", param=param)
    return text, np.asarray(samples, dtype=np.float32)


def talker_prompt(loaded: Any, messages: list[dict[str, Any]]) -> tuple[list[int], Any]:
    """(prompt ids, ARInputs) as the reference's processor makes them (`apply_chat_template`, the clip
    encoded by its codec) and its forward embeds them."""
    from omnistage.families.higgs_audio_v2.talker import prompt_inputs

    processor = loaded.processor()
    inputs = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    ids = inputs["input_ids"][0].tolist()
    return ids, prompt_inputs(loaded, ids, inputs.get("audio_input_ids"), inputs.get("audio_input_ids_mask"))


def speech_input(ctx: StageInputContext) -> StageRequest:
    """The speech route's prompt → the talker's prompt (and its frame sampling)."""
    from omnistage.families.higgs_audio_v2.talker import speech_state

    loaded = ctx.resources
    fields = speech_fields(ctx.prompt)
    text = str(fields.get("input") or "")
    if not text.strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")
    if fields.get("instructions") and fields.get("scene"):
        raise InvalidRequestError("scene: give scene or instructions, not both", param="scene")
    scene = fields.get("scene") or fields.get("instructions")
    messages = conversation(text, fields.get("system") or SYSTEM, scene, _voice(fields))
    ids, inputs = talker_prompt(loaded, messages)
    inputs.extension = speech_state(loaded.higgs_config, ids, ctx.params)
    config = loaded.higgs_config
    audio = sum(1 for t in ids if t in (config.audio_token_id, config.audio_delay_token_id))
    counts = TokenCounts(input_text_tokens=len(ids) - audio, input_audio_tokens=audio)
    return StageRequest(ctx.request_id, prompt=ids, params=ctx.params, inputs=inputs, token_counts=counts)


def codec_frames(codes: torch.Tensor | None, bos: int, eos: int) -> torch.Tensor:
    """The talker's frames [N, K] → codec frames [M, K], as the reference's `processor.batch_decode`: after
    the all-BOS frame, up to the first all-EOS one, the delay pattern reverted (codec frame i's codebook k
    is talker frame i + k's) and stream ids clipped into the codebook. Complete frames only: on a partial
    request, the frames whose every codebook has come."""
    if codes is None or codes.dim() != 2:
        return torch.empty((0, 0), dtype=torch.long)
    k = codes.shape[1]
    starts = (codes == bos).all(dim=1).nonzero()
    body = codes[int(starts[-1]) + 1 :] if len(starts) else codes
    ends = (body == eos).all(dim=1).nonzero()
    body = body[: int(ends[0])] if len(ends) else body
    count = len(body) - k + 1
    if count <= 0:
        return torch.empty((0, k), dtype=torch.long)
    frames = torch.stack([body[j : j + count, j] for j in range(k)], dim=1)
    return frames.clamp(0, bos - 1).long()


def _codec_request(ctx: StageInputContext, frames: torch.Tensor, streaming: bool) -> StageRequest:
    inputs = GenerationInputs(frames)
    first = speech_fields(ctx.prompt).get("initial_codec_chunk_frames")
    if first is not None:  # this request's first chunk (time to first audio), else the stage's by load
        inputs.first_chunk_frames = int(first)
    return StageRequest(ctx.request_id, params=ctx.params, inputs=inputs, streaming_input=streaming)


def codec_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: the talker's finished frames."""
    bos, eos = ctx.resources.stream_ids
    return _codec_request(ctx, codec_frames(ctx.upstream[0].codes, bos, eos), streaming=False)


def codec_chunk(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: the codec frames completed since the last chunk (a codec frame waits for the talker
    frame that brings its last codebook, `num_codebooks - 1` frames later)."""
    bos, eos = ctx.resources.stream_ids
    frames = codec_frames(ctx.upstream[0].codes, bos, eos)
    sent = int(ctx.state.get("sent", 0))
    ctx.state["sent"] = max(sent, len(frames))
    return stream_frames(ctx, frames[sent:], last, lambda part: _codec_request(ctx, part, True))


HIGGS_AUDIO_V2 = PipelineSpec(
    name="higgs_audio_v2",
    stages=(
        StageSpec(
            stage_id=0,
            name="talker",
            kind=StageKind.AR,
            input_processor=speech_input,
            sampling_constraints={"detokenize": False},
            default_params=TALKER_DEFAULTS,
            engine_args={
                "model_loader": f"{_MODELS}.talker:load_talker",
                "post_sample_hook": f"{_MODELS}.talker:frame_codes",
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
    default_deploy=str(HERE / "higgs_audio_v2.yaml"),
    family=FAMILY,
    capabilities=Capabilities(
        routes=("speech",),
        prompt="speech",
        fields={"sampling": (0,), "generation": (1,)},
        voices=("default",),  # the base model's own voice (any: unprompted); others are clips to clone
        clones_voices=True,
        speech_options=SPEECH_OPTIONS,
    ),
)
