"""One speech request, whichever route it came by (`/v1/audio/speech`, its batch, its WebSocket): the checks,
the prompt and per-stage params, the finished audio and its usage.

Keeping them in one place is what makes a batch item or a WebSocket sentence behave exactly like the same
fields posted to `/v1/audio/speech`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from omnistage.errors import InvalidRequestError, OmniError
from omnistage.media import change_speed, resample
from omnistage.outputs import OmniRequestOutput, TokenCounts
from omnistage.prompts import SpeechPrompt, UploadedVoice
from omnistage.serving.artifacts import audio_of, sample_rate_of
from omnistage.serving.context import ServerContext
from omnistage.serving.errors import SchemaError
from omnistage.serving.generation import generate, last_output
from omnistage.serving.media import encode_audio
from omnistage.serving.protocol import SpeechRequest
from omnistage.serving.served import ServedModel
from omnistage.serving.stage_params import build_stage_params

STREAM_FORMATS = ("pcm", "wav")


def validate_speech(body: SpeechRequest, model: ServedModel) -> None:
    """The rules across fields and those that need the model (its speed range)."""
    check_speech_options(body, model)
    if not body.input.strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")


def check_stream_format(body: SpeechRequest) -> None:
    """The one rule across fields that needs no model (checked before the model is looked up)."""
    if body.streaming and body.response_format not in STREAM_FORMATS:
        raise SchemaError(
            "response_format: streamed audio (stream, stream_format, stream_audio) requires 'pcm' or 'wav'",
            param="response_format",
        )


def check_speech_options(body: SpeechRequest, model: ServedModel) -> None:
    """Everything but the input: streaming formats, the speed range."""
    check_stream_format(body)
    speeds = model.capabilities.speed_range
    if speeds is not None and not speeds[0] <= body.speed <= speeds[1]:
        raise InvalidRequestError(
            f"speed: model {model.name!r} speaks at speeds in [{speeds[0]}, {speeds[1]}], got {body.speed}",
            param="speed",
        )
    if speeds is None and body.streaming and body.speed != 1.0:
        raise SchemaError("speed: streaming requires speed 1.0", param="speed")
    family_options(body, model)


def family_options(body: SpeechRequest, model: ServedModel) -> dict[str, Any]:
    """The family options the request sets, each checked against the type the model declares for it; a
    field the model does not declare is a 400 naming it."""
    caps, values = model.capabilities, {}
    for name, value in body.options().items():
        option = caps.speech_option(name)
        if option is None:
            takes = ", ".join(o.name for o in caps.speech_options) or "none"
            raise InvalidRequestError(
                f"{name}: model {model.name!r} does not take {name} (its speech options: {takes})", param=name
            )
        try:
            values[name] = msgspec.convert(value, option.type)
        except msgspec.ValidationError as exc:
            raise InvalidRequestError(f"{name}: {exc}", param=name) from None
    return values


async def speech_request(body: SpeechRequest, model: ServedModel, ctx: ServerContext) -> tuple[Any, list]:
    """(prompt, per-stage params). A model prompted with text (text-to-audio) gets the input text; any other
    a speech prompt dict (the text as `input` and as a user message, with `speaker`, `instructions`,
    `language`, an uploaded voice, the family options it takes; `ref_audio` as the bytes behind its
    reference, read within the server's media policy): a chat-capable pipeline (an omni thinker) reads
    `messages`, a TTS family the rest."""
    caps = model.capabilities
    voice = body.voice_name
    uploaded = ctx.voices.check(model, voice)
    limits = model.limits(ctx.settings)
    seed = {"seed": body.seed} if body.seed is not None else {}
    if caps.prompt == "text":
        params = build_stage_params(model, diffusion=seed, stage_params=body.stage_params, limits=limits)
        return body.input, params
    options = family_options(body, model)
    for name, value in options.items():
        media = caps.speech_option(name).media  # audio the server reads within its media policy, as bytes
        if media is True:
            options[name], _ = await ctx.media.read(value, param=name)
        elif media:  # a list of items, each naming its audio under the key `media`
            options[name] = [
                {**item, media: (await ctx.media.read(item[media], param=f"{name}[{i}].{media}"))[0]}
                if item.get(media) is not None
                else item
                for i, item in enumerate(value)
            ]
    prompt = SpeechPrompt(
        input=body.input,
        speaker=voice or None,
        instructions=body.instructions or None,
        language=body.language or None,
        # the voice to clone, read by the stage from its file
        uploaded_voice=None
        if uploaded is None
        else UploadedVoice(
            name=uploaded.name,
            path=str(uploaded.path),
            sample_rate=uploaded.sample_rate,
            ref_text=uploaded.ref_text,
        ),
        speed=body.speed if caps.speed_range is not None else None,  # the model speaks at it itself
        options=options,
    )
    sampling = {**seed, **({"max_tokens": body.max_new_tokens} if body.max_new_tokens is not None else {})}
    params = build_stage_params(
        model,
        sampling=sampling,
        generation=seed,
        stage_params=body.stage_params,
        route_defaults={"max_tokens": None},  # as chat: the whole answer, up to the context
        limits=limits,
        origins={"max_tokens": "max_new_tokens"},
    )
    return prompt, params


def speech_usage(out: OmniRequestOutput | None) -> dict[str, Any]:
    counts = (out.token_counts if out else None) or TokenCounts()
    # What the stages counted (a TTS family counts its text and reference clip), else the prompt's tokens.
    text_tokens = counts.input_text_tokens if counts.input_text_tokens is not None else _prompt_tokens(out)
    audio_in = counts.input_audio_tokens or 0
    output = counts.output_tokens if counts.output_tokens is not None else (len(out.token_ids) if out else 0)
    return {
        "input_tokens": text_tokens + audio_in,
        "output_tokens": output,
        "total_tokens": text_tokens + audio_in + output,
        "input_token_details": {"text_tokens": text_tokens, "audio_tokens": audio_in},
    }


def _prompt_tokens(out: OmniRequestOutput | None) -> int:
    return len(out.prompt_token_ids) if out else 0


def usage_headers(usage: dict[str, Any]) -> dict[str, str]:
    """Speech usage as response headers, under omnistage's names and vLLM-Omni's (`x-vllm-omni-*`, what
    scripts and `vllm bench serve --omni` written against it read)."""
    values = {
        "input-tokens": usage["input_tokens"],
        "output-tokens": usage["output_tokens"],
        "total-tokens": usage["total_tokens"],
        "input-text-tokens": usage["input_token_details"]["text_tokens"],
        "input-audio-tokens": usage["input_token_details"]["audio_tokens"],
    }
    return {
        f"x-{prefix}-{name}": str(v) for prefix in ("omnistage", "vllm-omni") for name, v in values.items()
    }


def encoded_audio(out: OmniRequestOutput, body: SpeechRequest, model: ServedModel) -> tuple[bytes, int]:
    """(the finished audio in the requested format, speed and sample rate; its sample rate)."""
    samples = audio_of(out)
    if samples is None:
        raise OmniError("the model did not produce audio")
    rate = sample_rate_of(out)
    if model.capabilities.speed_range is None:
        samples = change_speed(samples, rate, body.speed)
    if body.sample_rate:
        samples, rate = resample(samples, rate, body.sample_rate), body.sample_rate
    return encode_audio(samples, rate, body.response_format)


def audio_chunk(out: OmniRequestOutput, body: SpeechRequest) -> tuple[Any, int]:
    """The new samples of a streamed output (at the requested rate) or None, and their rate."""
    samples, rate = audio_of(out, delta=True), sample_rate_of(out)
    if samples is not None and body.sample_rate and body.sample_rate != rate:
        samples, rate = resample(samples, rate, body.sample_rate), body.sample_rate
    return samples, rate


async def speak(
    body: SpeechRequest, model: ServedModel, ctx: ServerContext, request_id: str
) -> tuple[OmniRequestOutput, bytes, int]:
    """A whole (non-streamed) speech request: (its final output, the encoded audio, its sample rate).
    Cancelling it aborts the request in every stage (`generate`)."""
    validate_speech(body, model)
    prompt, params = await speech_request(body, model, ctx)
    out = await last_output(generate(model, ctx.metrics, prompt, params, request_id, ["audio"]))
    data, rate = await asyncio.to_thread(encoded_audio, out, body, model)  # encoding takes seconds for mp3
    return out, data, rate
