"""Qwen3-TTS (12 Hz): text → talker codes (16 codebooks a frame) → 24 kHz waveform.

Stage 0, the talker, runs on the AR engine; its code predictor runs in the post-sample hook, batched over
the step's sequences, so each step yields a whole frame (talker.py). Stage 1, the codec
decoder, runs on the generation engine (decoder_stage.py): in async chunk it decodes the
frames as they come, in full handoff once the talker is done, exactly as the reference.

Tasks follow the checkpoint's `tts_model_type`: CustomVoice (`custom_voice`: a preset `voice`, optional
`instructions`), VoiceDesign (`voice_design`: `instructions` required, no preset voice), Base (`base`:
voice cloning from an uploaded voice: the clip's speaker embedding in the preset speaker's place, and when
the voice has a transcript (`ref_text`) and the request does not ask `x_vector_only_mode`, in-context: the
clip's codes and transcript in the prompt, the clip's codes decoded before the new ones as context only).
A request that does not fit the checkpoint's task answers 400 naming the task the checkpoint serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
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
# A speech request's Qwen3-TTS fields (vLLM-Omni's names), typed: the speech routes check them, and the
# talker's input processor reads them from the speech prompt.
SPEECH_OPTIONS = (
    SpeechOption("task_type", Literal["CustomVoice", "VoiceDesign", "Base"], "the checkpoint's task"),
    SpeechOption(
        "ref_audio",
        str,
        "the voice to clone: a data URL, or a local path the server allows",
        media=True,
    ),
    SpeechOption("ref_text", Annotated[str, msgspec.Meta(max_length=4096)], "what ref_audio says"),
    SpeechOption("x_vector_only_mode", bool, "clone from the speaker embedding only (no in-context clip)"),
    SpeechOption(
        "initial_codec_chunk_frames",
        Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)],
        "codec frames in the first audio chunk",
    ),
)
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py

_MODELS = "omnistage.families.qwen3_tts"
ARCHITECTURE = "Qwen3TTSForConditionalGeneration"
TASKS = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "base": "Base"}
CODEC_EOS, CODEBOOK = 2150, 2048
# The reference generate's defaults (generation_config.json): sampled, repetition penalty 1.05 on the
# generated codes, codes 2048.. suppressed but EOS, at least 2 frames. The code predictor samples with the
# checkpoint's `subtalker_*` settings (greedy when the talker is).
TALKER_DEFAULTS = {
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.05,
    "min_tokens": 2,
    "max_tokens": 4095,
    "allowed_token_ids": [*range(CODEBOOK), CODEC_EOS],
}


def speech_input(ctx: StageInputContext) -> StageRequest:
    """The speech route's prompt ({"input", "speaker", "instructions", "language"}) → the talker's prompt."""
    from omnistage.families.qwen3_tts.prompt import talker_prompt

    loaded = ctx.resources
    prompt = speech_fields(ctx.prompt)
    text = str(prompt.get("input") or "")
    if not text.strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")
    first = prompt.get("initial_codec_chunk_frames")
    if first is not None and (isinstance(first, bool) or not isinstance(first, int) or first < 0):
        field = "initial_codec_chunk_frames"
        raise InvalidRequestError(f"{field}: must be an integer >= 0, got {first!r}", param=field)
    task = loaded.tts_config.get("tts_model_type")
    serves = TASKS.get(task, task)
    asked = prompt.get("task_type")
    if asked is not None and asked != serves:
        raise InvalidRequestError(
            f"task_type: this checkpoint serves {serves}, not {asked}; use task_type={serves!r} or serve the "
            "matching checkpoint",
            param="task_type",
        )
    speaker, instructions = prompt.get("speaker"), prompt.get("instructions")
    cloned = clone_voice(prompt)
    if (cloned is not None) != (task == "base"):
        field = "ref_audio" if "ref_audio" in prompt else "voice"
        raise InvalidRequestError(
            f"{field}: this checkpoint serves {serves}"
            + (
                ": it clones a voice (an uploaded voice or ref_audio)"
                if task == "base"
                else "; it cannot clone a voice"
            ),
            param=field,
        )
    speaker_embed = ref_codes = ref_ids = None
    if cloned is not None:  # the reference's voice clone takes no instructions
        speaker, instructions = None, None
        speaker_embed, ref_codes = _voice_features(loaded, cloned, prompt)
        if ref_codes is not None:
            ref_text = f"<|im_start|>assistant\n{cloned['ref_text']}<|im_end|>\n"
            ref_ids = loaded.tokenizer(ref_text)["input_ids"]
    if task == "custom_voice" and not speaker:
        raise InvalidRequestError(
            "voice: CustomVoice needs a voice (one of the model's speakers)", param="voice"
        )
    if task == "voice_design":
        if not instructions:
            raise InvalidRequestError("instructions: VoiceDesign needs instructions", param="instructions")
        speaker = None  # a designed voice has no preset speaker
    tokenizer = loaded.tokenizer
    input_ids = tokenizer(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    instruct_ids = None
    if instructions:
        instruct_ids = tokenizer(f"<|im_start|>user\n{instructions}<|im_end|>\n")["input_ids"]
    language = str(prompt.get("language") or "auto")
    # The reference's defaults: the whole text in the prompt, except Base, which reads a token a frame.
    non_streaming = task != "base"
    ids, inputs = talker_prompt(
        loaded, input_ids, instruct_ids, language, speaker, non_streaming, speaker_embed=speaker_embed,
        ref_ids=ref_ids, ref_codes=ref_codes,
    )  # fmt: skip
    text_tokens = len(input_ids) + len(instruct_ids or []) + len(ref_ids or [])
    inputs.extension.subtalker = _subtalker(loaded, ctx.params)
    audio_tokens = len(ref_codes) if ref_codes is not None else 0  # the clip's frames, in context
    counts = TokenCounts(input_text_tokens=text_tokens, input_audio_tokens=audio_tokens)
    return StageRequest(ctx.request_id, prompt=ids, params=ctx.params, inputs=inputs, token_counts=counts)


def _subtalker(loaded: object, params: object) -> dict[str, Any] | None:
    """The code predictor's sampling (the reference's `subtalker_*`, from the checkpoint's generation
    config): none when the talker is greedy, else seeded by the request's seed (or a fresh one), so a
    seeded request's 16 codebooks repeat exactly, alone or batched."""
    import random

    temperature = getattr(params, "temperature", None)
    gen = loaded.generation_config
    if temperature == 0.0 or not gen.get("subtalker_dosample", False):
        return None
    seed = getattr(params, "seed", None)
    return {
        "do_sample": True,
        "temperature": float(gen.get("subtalker_temperature", 0.9)),
        "top_k": int(gen.get("subtalker_top_k", 50)),
        "top_p": float(gen.get("subtalker_top_p", 1.0)),
        "seed": int(seed) if seed is not None else random.getrandbits(62),
    }


def clone_voice(prompt: dict) -> dict | None:
    """The voice a Base request clones: an uploaded voice (read from its file), or the request's own clip
    (`ref_audio`, its bytes, with `ref_text`); never both. `ref_text` or `x_vector_only_mode` without a clip
    to go with them is a 400."""
    uploaded, inline = prompt.get("uploaded_voice"), prompt.get("ref_audio")
    if uploaded is not None and inline is not None:
        raise InvalidRequestError(
            "ref_audio: give ref_audio or an uploaded voice, not both", param="ref_audio"
        )
    for field in ("ref_text", "x_vector_only_mode"):
        if prompt.get(field) is not None and uploaded is None and inline is None:
            raise InvalidRequestError(f"{field}: needs a voice to clone (ref_audio)", param=field)
    if inline is None:
        return uploaded
    if not isinstance(inline, bytes | bytearray) or not inline:
        raise InvalidRequestError("ref_audio: needs the bytes of an audio clip", param="ref_audio")
    return {"name": "ref_audio", "data": bytes(inline), "ref_text": prompt.get("ref_text")}


def _in_context(voice: dict | None, prompt: dict) -> bool:
    """Base clones in context when the voice has a transcript, unless the request asks x-vector-only."""
    return voice is not None and bool(voice.get("ref_text")) and not prompt.get("x_vector_only_mode", False)


def _voice_entry(owner: object, voice: dict) -> dict:
    """A cloned voice's features, kept on `owner` (a stage's loaded model) per voice file (path, mtime,
    size) or per inline clip (its hash): its 24 kHz clip first, then whatever the stage derives from it."""
    import hashlib
    import os

    import numpy as np

    from omnistage.families.qwen3_tts.speaker import SAMPLE_RATE
    from omnistage.media import decode_audio, resample, voice_samples

    cache = owner.__dict__.setdefault("voice_features", {})
    if "data" in voice:  # a request's own clip: keyed by its content
        key = ("ref_audio", hashlib.sha256(voice["data"]).hexdigest())
    else:
        stat = os.stat(voice["path"])
        key = (voice["path"], stat.st_mtime_ns, stat.st_size)
    if key not in cache:
        try:  # a request's clip, or a voice file (the server's store, or the offline API's audio file)
            samples, rate = decode_audio(voice["data"]) if "data" in voice else voice_samples(voice["path"])
        except Exception as exc:  # whatever the decoder makes of bytes that are not audio
            message = f"ref_audio: not a readable audio clip ({exc})"
            raise InvalidRequestError(message, param="ref_audio") from None
        samples = samples.mean(axis=0) if samples.ndim == 2 else samples
        if rate != SAMPLE_RATE:
            samples = resample(samples, rate, SAMPLE_RATE)
        cache[key] = {"clip": torch.from_numpy(np.asarray(samples, dtype=np.float32))}
    return cache[key]


def _voice_features(loaded: object, voice: dict, prompt: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The talker's view of an uploaded voice: (x-vector, clip codes or None for x-vector-only)."""
    entry = _voice_entry(loaded, voice)
    if "x_vector" not in entry:
        entry["x_vector"] = loaded.speaker_encoder.embed(entry["clip"])
    if not _in_context(voice, prompt):
        return entry["x_vector"], None
    if "codes" not in entry:
        entry["codes"] = loaded.codec_encoder.encode(entry["clip"])
    return entry["x_vector"], entry["codes"]


def _clip_codes(generator: object, prompt: Any) -> torch.Tensor | None:
    """The codec stage's view: an in-context clone's clip codes (its own encoder, loaded on first use)."""
    prompt = speech_fields(prompt)
    voice = clone_voice(prompt)
    if not _in_context(voice, prompt):
        return None
    entry = _voice_entry(generator, voice)
    if "codes" not in entry:
        if "encoder" not in generator.__dict__:
            from omnistage.families.qwen3_tts.encoder import load_encoder

            generator.encoder = load_encoder(generator.model_dir)
        entry["codes"] = generator.encoder.encode(entry["clip"])
    return entry["codes"]


def _frames(codes: torch.Tensor | None) -> torch.Tensor:
    """The talker's frames without its EOS frame."""
    if codes is None:
        return torch.empty((0, 16), dtype=torch.long)
    return codes[codes[:, 0] != CODEC_EOS]


def _codec_request(ctx: StageInputContext, frames: torch.Tensor, streaming: bool) -> StageRequest:
    """The codec's request: an in-context clone's clip codes go first, as context only (the reference
    decodes clip + new codes and cuts the clip's share)."""
    ref = _clip_codes(ctx.resources, ctx.prompt)
    inputs = GenerationInputs(frames)
    if ref is not None:
        inputs = GenerationInputs(torch.cat([ref.to(frames.dtype), frames]), context_frames=len(ref))
    first = speech_fields(ctx.prompt).get("initial_codec_chunk_frames")
    if first is not None:  # this request's first chunk (time to first audio), else the stage's by load
        inputs.first_chunk_frames = int(first)
    return StageRequest(ctx.request_id, params=ctx.params, inputs=inputs, streaming_input=streaming)


def codec_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: the talker's finished frames."""
    return _codec_request(ctx, _frames(ctx.upstream[0].codes), streaming=False)


def codec_chunk(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: each step's new frames as they come."""
    return stream_frames(ctx, _frames(chunk.codes), last, lambda frames: _codec_request(ctx, frames, True))


def checkpoint_speakers(model_dir: str) -> list[str]:
    """The checkpoint's preset voices (CustomVoice), for the voices list."""
    from omnistage.families.qwen3_tts.talker import read_config

    return sorted((read_config(model_dir)["talker_config"].get("spk_id") or {}).keys())


QWEN3_TTS = PipelineSpec(
    name="qwen3_tts",
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
                "post_sample_hook": f"{_MODELS}.talker:predict_codes",
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
            engine=f"{_MODELS}.decoder_stage:create_engine",
        ),
    ),
    architectures=(ARCHITECTURE,),
    default_deploy=str(HERE / "qwen3_tts.yaml"),
    family=FAMILY,
    capabilities=Capabilities(
        routes=("speech",),
        prompt="speech",
        fields={"sampling": (0,), "generation": (1,)},
        voices_of="omnistage.families.qwen3_tts.pipeline:checkpoint_speakers",
        clones_voices=True,
        speech_options=SPEECH_OPTIONS,  # the speech route checks them against these types
    ),
)
