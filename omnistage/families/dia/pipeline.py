"""Dia: a dialogue script ("[S1] ... [S2] ...", byte-level) → the decoder's delayed DAC frames (C channels
a frame at ~86 Hz) → 44.1 kHz waveform.

Stage 0, the decoder, runs on the AR engine (decoder.py): the input processor runs the text encoder once
(its output is what the decoder's cross-attention reads), the post-sample hook picks every channel of a
frame under the delay pattern. Stage 1, DAC's decoder, on the generation engine (codec.py): the frames
undelayed (`undelay`) as they come, async chunks decoded behind their exact context, full handoff in one
pass as the reference's `DiaProcessor.batch_decode`.

A request may continue a clip (`ref_audio` with its transcript `ref_text`, as Dia clones a voice): the clip's
DAC codes become the decoder's prefix, the transcript precedes the script, and only the new frames are
spoken.

Classifier-free guidance as the reference's `generate` applies it by default (the checkpoint's scale, 3.0 for
Dia-1.6B; the request's `guidance_scale`, 1 for none): each request's decoder runs beside an unconditional
twin attending the encoder's output for a zeroed text (stages/ar/guidance.py), and the hook combines the
two (decoder.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec
import torch

from omnistage.config.capabilities import Capabilities, SpeechOption
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.outputs import StageOutput, TokenCounts
from omnistage.prompts import SpeechPrompt, prompt_text
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.generation.engine import stream_frames
from omnistage.stages.generation.generation_inputs import GenerationInputs

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py
_MODELS = "omnistage.families.dia"
ARCHITECTURE = "DiaForConditionalGeneration"
# Dia-1.6B's generation_config (temperature 1.8, top-k 45, top-p 0.9; a temperature under 1 is clamped to
# 1, as its `generate` does) and its max_length in frames.
DECODER_DEFAULTS = {"temperature": 1.8, "top_k": 45, "top_p": 0.9, "max_tokens": 3072}
Text = Annotated[str, msgspec.Meta(max_length=4096)]
SPEECH_OPTIONS = (
    SpeechOption(
        "ref_audio", str, "a clip of the voice(s) to continue (the decoder's audio prompt)", media=True
    ),
    SpeechOption("ref_text", Text, "what ref_audio says, speaker-tagged ([S1] ... [S2] ...)"),
    SpeechOption(
        "guidance_scale",
        Annotated[float, msgspec.Meta(ge=1.0, le=20.0)],
        "classifier-free guidance scale (1: off; default: the checkpoint's, 3.0 for Dia-1.6B)",
    ),
)


def _reference(loaded: Any, options: dict[str, Any], voice: Any = None) -> tuple[str, torch.Tensor | None]:
    """An audio prompt as Dia clones a voice: the clip's DAC codes (the decoder prefix) and its transcript,
    which the script must start with (the encoder reads both). The clip is the request's own (`ref_audio`)
    or an uploaded voice's file, with its transcript."""
    clip, text = options.get("ref_audio"), options.get("ref_text")
    if voice is not None:
        if clip is not None:
            raise InvalidRequestError(
                "ref_audio: give ref_audio or an uploaded voice, not both", param="ref_audio"
            )
        text = text or voice.ref_text
        if not text:
            raise InvalidRequestError(
                f"voice: uploaded voice {voice.name!r} has no transcript (ref_text); Dia continues a clip "
                "from what it says",
                param="voice",
            )
    elif clip is None:
        if text is not None:
            raise InvalidRequestError("ref_text: needs its clip (ref_audio)", param="ref_text")
        return "", None
    if not text:
        raise InvalidRequestError("ref_text: ref_audio needs its transcript", param="ref_text")
    if voice is None and (not isinstance(clip, bytes | bytearray) or not clip):
        raise InvalidRequestError("ref_audio: needs the bytes of an audio clip", param="ref_audio")
    from omnistage.media import decode_audio, resample, voice_samples

    param = "voice" if voice is not None else "ref_audio"
    try:
        samples, rate = voice_samples(voice.path) if voice is not None else decode_audio(bytes(clip))
    except Exception as exc:  # whatever the decoder makes of bytes that are not audio
        raise InvalidRequestError(f"{param}: not a readable audio clip ({exc})", param=param) from None
    samples = samples.mean(axis=0) if samples.ndim == 2 else samples
    rate_wanted = int(loaded.clip_rate())
    samples = resample(samples, rate, rate_wanted) if rate != rate_wanted else samples
    if len(samples) == 0:
        raise InvalidRequestError(f"{param}: the clip is empty", param=param)
    return text if text[-1:].isspace() else text + " ", loaded.clip_codes(samples)


def speech_input(ctx: StageInputContext) -> StageRequest:
    """The speech route's script → the decoder's prompt (BOS frame), the text encoder's output and the
    request's frame rules."""
    from omnistage.families.dia.decoder import decoder_prompt

    prompt = ctx.prompt
    if isinstance(prompt, SpeechPrompt) and prompt.instructions:
        raise InvalidRequestError("instructions: Dia takes no instructions", param="instructions")
    text = prompt.input if isinstance(prompt, SpeechPrompt) else prompt_text(prompt)
    if not str(text or "").strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")
    options = prompt.options if isinstance(prompt, SpeechPrompt) else {}
    voice = prompt.uploaded_voice if isinstance(prompt, SpeechPrompt) else None
    before, codes = _reference(ctx.resources, options, voice)
    scale = options.get("guidance_scale")
    try:
        ids, inputs = decoder_prompt(ctx.resources, before + text, ctx.params, codes, scale)
    except ValueError as exc:
        param = "guidance_scale" if "guidance_scale" in str(exc) else "max_tokens"
        raise InvalidRequestError(str(exc), param=param) from None
    text_tokens = int(inputs.encoder_hidden_states.shape[0])
    counts = TokenCounts(input_text_tokens=text_tokens, input_audio_tokens=len(ids) - 1)
    return StageRequest(ctx.request_id, prompt=ids, params=ctx.params, inputs=inputs, token_counts=counts)


def _undelayed(ctx: StageInputContext, delayed: torch.Tensor | None) -> torch.Tensor:
    from omnistage.families.dia.codec import undelay

    generator = ctx.resources
    if delayed is None or len(delayed) == 0:
        return torch.empty((0, len(generator.delay_pattern)), dtype=torch.long)
    return undelay(torch.as_tensor(delayed), generator.delay_pattern, generator.special["eos"])


def codec_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: the decoder's finished frames, undelayed."""
    frames = _undelayed(ctx, ctx.upstream[0].codes)
    return StageRequest(ctx.request_id, params=ctx.params, inputs=GenerationInputs(frames))


def codec_chunk(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: the audio frames each new delayed frame completes (frame j once delayed frame j +
    max(delay) came), up to channel 0's EOS."""
    parts = ctx.state.setdefault("delayed", [])
    if chunk.codes is not None and len(chunk.codes):
        parts.append(torch.as_tensor(chunk.codes))
    delayed = torch.cat(parts) if parts else None
    if delayed is not None:
        ctx.state["delayed"] = [delayed]
    frames = _undelayed(ctx, delayed)
    sent = ctx.state.get("sent", 0)
    ctx.state["sent"] = len(frames)
    new = frames[sent:]
    return stream_frames(
        ctx,
        new,
        last,
        lambda part: StageRequest(
            ctx.request_id, params=ctx.params, inputs=GenerationInputs(part), streaming_input=True
        ),
    )


DIA = PipelineSpec(
    name="dia",
    stages=(
        StageSpec(
            stage_id=0,
            name="decoder",
            kind=StageKind.AR,
            input_processor=speech_input,
            sampling_constraints={"detokenize": False},
            default_params=DECODER_DEFAULTS,
            engine_args={
                "model_loader": f"{_MODELS}.decoder:load_decoder",
                "post_sample_hook": f"{_MODELS}.decoder:dia_frame",
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
    default_deploy=str(HERE / "dia.yaml"),
    family=FAMILY,
    capabilities=Capabilities(
        routes=("speech",),
        prompt="speech",
        fields={"sampling": (0,), "generation": (1,)},
        # one built-in voice: the script's own speakers ([S1], [S2]) as the model samples them; an uploaded
        # voice (a clip and its transcript) is continued as an audio prompt
        voices=("default",),
        clones_voices=True,
        speech_options=SPEECH_OPTIONS,
    ),
)
