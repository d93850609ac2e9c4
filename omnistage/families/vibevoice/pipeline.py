"""VibeVoice: a script of up to four speakers' lines → the LM's frames, each made into sound in its step
(AR, decoder.py) → the waveform, streamed as it comes.

Stage 0, the LM, runs on the AR engine: its post-sample hook denoises each frame's latent, decodes it with
the acoustic tokenizer's causal decoder and reads it back with the semantic encoder (the next input needs
the sound, so the waveform is made there, as `generate` makes it). Stage 1 passes the frames' samples on
through the generation engine: chunked for async-chunk streaming (the first chunk after the first frames,
by the stage's load), or the whole waveform at once (full handoff).

Voices are cloned from clips, as VibeVoice does it: Speaker 0's from `ref_audio` or the uploaded voice the
request names, any speaker's from `speaker_clips` ({speaker, audio}); a speaker without one speaks in a
voice of the model's choosing.
"""

from __future__ import annotations

from collections.abc import Generator as Steps
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec
import numpy as np
import torch

from omnistage.config.capabilities import Capabilities, SpeechOption
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.families.shared.clips import mono_clip
from omnistage.families.shared.codec_stage import CodecArgs, codec_engine
from omnistage.families.shared.speech_fields import speech_fields
from omnistage.families.vibevoice.prompt import MAX_SPEAKERS
from omnistage.outputs import StageOutput, TokenCounts
from omnistage.stages.base import EngineContext, StageInputContext, StageRequest
from omnistage.stages.generation.engine import GenerationBatch, GenerationEngine, one_unit, stream_frames
from omnistage.stages.generation.generation_inputs import GenerationInputs

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py
_MODELS = "omnistage.families.vibevoice"
# Frames (7.5 a second) a request may speak: a text token's worth of speech is about two frames; a request
# speaks at most 4 a prompt token + 32 unless max_tokens says less (`generate` stops at its max_length)
FRAMES_PER_TOKEN, EXTRA_FRAMES, MAX_FRAMES = 4, 32, 20000
Speaker = Annotated[int, msgspec.Meta(ge=0, le=MAX_SPEAKERS - 1)]


class SpeakerClip(TypedDict, total=False):
    """A speaker's voice: which speaker, and a clip of them (the server reads it: its bytes reach the LM)."""

    speaker: Speaker
    audio: str


SPEECH_OPTIONS = (
    SpeechOption("ref_audio", str, "a clip of Speaker 0's voice to clone", media=True),
    SpeechOption(
        "speaker_clips",
        Annotated[list[SpeakerClip], msgspec.Meta(max_length=MAX_SPEAKERS)],
        "the speakers' voices to clone: {speaker, audio}",
        media="audio",
    ),
    SpeechOption(
        "cfg_scale",
        Annotated[float, msgspec.Meta(ge=1.0, le=10.0)],
        "the diffusion head's classifier-free guidance (default: the checkpoint's, 1.3)",
    ),
    SpeechOption(
        "diffusion_steps",
        Annotated[int, msgspec.Meta(ge=1, le=100)],
        "denoising steps a frame (default: the checkpoint's, 10)",
    ),
)


def _clips(loaded: Any, fields: dict[str, Any]) -> dict[int, np.ndarray]:
    """Each cloned speaker's clip: Speaker 0's from `ref_audio` or the uploaded voice, any speaker's
    from `speaker_clips`; one clip a speaker."""
    rate = loaded.sample_rate
    clips: dict[int, np.ndarray] = {}
    voice, inline = fields.get("uploaded_voice"), fields.get("ref_audio")
    if voice is not None and inline is not None:
        raise InvalidRequestError(
            "ref_audio: give ref_audio or an uploaded voice, not both", param="ref_audio"
        )
    if inline is not None:
        if not isinstance(inline, bytes | bytearray) or not inline:
            raise InvalidRequestError("ref_audio: needs the bytes of an audio clip", param="ref_audio")
        clips[0] = mono_clip(inline, rate, "ref_audio")
    elif voice is not None:
        clips[0] = mono_clip(voice["path"], rate, "voice")
    for i, entry in enumerate(fields.get("speaker_clips") or []):
        param = f"speaker_clips[{i}]"
        if entry.get("speaker") is None or not entry.get("audio"):
            raise InvalidRequestError(f"{param}: needs speaker and audio", param=param)
        speaker = int(entry["speaker"])
        if speaker in clips:
            raise InvalidRequestError(f"{param}: Speaker {speaker} already has a voice", param=param)
        clips[speaker] = mono_clip(entry["audio"], rate, f"{param}.audio")
    return clips


def speech_input(ctx: StageInputContext) -> StageRequest:
    """The speech route's script → the LM's prompt (the cloned voices' latents in place) and the request's
    diffusion settings; `max_tokens` capped by the script's length."""
    from omnistage.families.vibevoice.prompt import speech_prompt

    loaded = ctx.resources
    fields = speech_fields(ctx.prompt)
    text = str(fields.get("input") or "")
    if not text.strip():
        raise InvalidRequestError("input: Input text cannot be empty", param="input")
    if fields.get("instructions"):
        raise InvalidRequestError("instructions: VibeVoice takes no instructions", param="instructions")
    params = ctx.params
    if int(getattr(params, "n", 1) or 1) != 1:
        raise InvalidRequestError("n: VibeVoice speaks one waveform a request", param="n")
    clips = _clips(loaded, fields)
    ids, inputs = speech_prompt(
        loaded,
        text,
        params,
        clips,
        guidance_scale=fields.get("cfg_scale"),
        diffusion_steps=fields.get("diffusion_steps"),
    )
    cap = min(MAX_FRAMES, FRAMES_PER_TOKEN * len(ids) + EXTRA_FRAMES)
    params = msgspec.structs.replace(params, max_tokens=min(int(params.max_tokens or cap), cap))
    audio = ids.count(loaded.ids["token"])
    counts = TokenCounts(input_text_tokens=len(ids) - audio, input_audio_tokens=audio)
    return StageRequest(ctx.request_id, prompt=ids, params=params, inputs=inputs, token_counts=counts)


def _frames(audio: Any) -> torch.Tensor:
    """Stage 0's frames of samples [F, hop] as float32 ([0, 0] for none)."""
    return torch.empty(0, 0) if audio is None else torch.as_tensor(audio, dtype=torch.float32)


def audio_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: every frame's samples at once."""
    frames = _frames(ctx.upstream[0].tensor("audio"))
    return StageRequest(ctx.request_id, params=ctx.params, inputs=GenerationInputs(frames))


def audio_chunk(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: each step's frame as it comes."""
    return stream_frames(ctx, _frames(chunk.tensors.get("audio")), last)


class FrameAudio:
    """The generation engine's generator for stage 1: a window of frames' samples [T, hop] is its
    waveform (the LM's hook made the sound; nothing is left to decode)."""

    def __init__(self, sample_rate: int, hop: int):
        self.sample_rate, self.outputs_per_frame = sample_rate, hop

    def run(self, batch: GenerationBatch) -> Steps[None, None, list[torch.Tensor]]:
        return one_unit(lambda: [w.reshape(-1).float() for w in batch.windows])


def create_audio_engine(ctx: EngineContext) -> GenerationEngine:
    """Stage 1 on the generation engine, chunked as `CodecArgs` says (shared/codec_stage.py)."""
    import json

    config = json.loads((Path(ctx.model_dir) / "config.json").read_text())
    ratios = config.get("audio_config", {}).get("downsampling_ratios") or [2, 2, 4, 5, 5, 8]
    return codec_engine(ctx, FrameAudio(24000, int(np.prod(ratios))), 0)


create_audio_engine.args_type = CodecArgs


def resolve(info: Any) -> PipelineSpec | None:
    config = info.config or {}
    return VIBEVOICE if config.get("model_type") == "vibevoice" else None


VIBEVOICE = PipelineSpec(
    name="vibevoice",
    stages=(
        StageSpec(
            stage_id=0,
            name="lm",
            kind=StageKind.AR,
            input_processor=speech_input,
            # the LM picks among its four audio-time tokens greedily, as the reference's argmax; a request's
            # seed is its noise's
            sampling_constraints={"detokenize": False, "temperature": 0.0},
            engine_args={
                "model_loader": f"{_MODELS}.decoder:load_vibevoice",
                "post_sample_hook": f"{_MODELS}.decoder:vibevoice_frame",
            },
        ),
        StageSpec(
            stage_id=1,
            name="audio",
            kind=StageKind.GENERATION,
            inputs=(0,),
            final_output=True,
            output_modality="audio",
            input_processor=audio_input,
            chunk_processor=audio_chunk,
            engine=f"{_MODELS}.pipeline:create_audio_engine",
        ),
    ),
    architectures=("VibeVoiceForConditionalGeneration",),
    default_deploy=str(HERE / "vibevoice.yaml"),
    family=FAMILY,
    capabilities=Capabilities(
        routes=("speech",),
        prompt="speech",
        fields={"sampling": (0,), "generation": (1,)},
        # the model's own voice (no clip); an uploaded voice is cloned from its clip as Speaker 0's
        voices=("default",),
        clones_voices=True,
        speech_options=SPEECH_OPTIONS,
    ),
)
