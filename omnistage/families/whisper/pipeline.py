"""Whisper: speech in, text out (transcription, and translation into English on multilingual models).

How to use:
- A directory whose config.json says `"model_type": "whisper"` (a transformers Whisper checkpoint) resolves
  to this pipeline; `omnistage serve DIR` serves `POST /v1/audio/transcriptions` (and `/translations` where
  the model is multilingual); the demo serves OpenAI's tiny.en as "whisper-tiny.en" (demo/whisper.py).
- In Python: `Omni(DIR).generate(prompt, params)` with the prompt an `AudioPrompt` (omnistage/prompts.py:
  float32 samples at 16 kHz (np.ndarray or tensor), `language` "en" | None, `task` "transcribe" |
  "translate", `prompt` previous text | None; the dict of those fields works too);
  `transcription_prompt(...)` builds it. `params` are the decoder's SamplingParams (greedy
  `temperature=0` matches transformers' `generate`).
- Output: one text choice per segment (`outputs["choices"]`, in order; `text` alone for one segment) and
  `data["segments"]`: each segment's (start, end) in seconds of the input.

Stages:
- 0 `encoder` (generation engine): audio up to 30 s is one segment, longer audio is cut at silero VAD's
  pauses into segments of <= 30 s (segments.py); log-mel features and the encoder run
  batched over every segment of every request in a pass.
- 1 `decoder` (AR engine): one sequence per segment, each attending its own encoder output (the AR
  engine's encoder-decoder seam: cross K/V projected once per sequence at admission); the forced prompt
  and suppressed tokens are the GenerationConfig's (decoding.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

from omnistage.config.capabilities import Capabilities, Limits
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.families.resolve import ModelInfo
from omnistage.params import SamplingParams
from omnistage.prompts import AudioPrompt
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py

_MODELS = "omnistage.families.whisper"
SAMPLE_RATE = 16000
ENCODER_KEY = "encoder_hidden"


def transcription_prompt(
    audio: Any, language: str | None = None, task: str = "transcribe", prompt: str | None = None
) -> AudioPrompt:
    """The entry prompt for 16 kHz mono samples."""
    return AudioPrompt(audio=audio, language=language, task=task, prompt=prompt)


def _audio(prompt: Any) -> np.ndarray:
    audio = prompt.audio if isinstance(prompt, AudioPrompt) else None
    if audio is None:
        raise InvalidRequestError("the prompt needs `audio`: mono float32 samples at 16 kHz", param="file")
    audio = audio.numpy() if isinstance(audio, torch.Tensor) else np.asarray(audio)
    audio = audio.astype(np.float32, copy=False).reshape(-1)
    if not len(audio):
        raise InvalidRequestError("the audio is empty", param="file")
    return audio


# ---- input processors (each runs in its stage's process) -------------------------------------------------
def encoder_input(ctx: StageInputContext) -> StageRequest:
    from omnistage.families.whisper.encoder import as_segments
    from omnistage.families.whisper.segments import segment_bounds

    audio = _audio(ctx.prompt)
    segments = [audio[a:b] for a, b in segment_bounds(audio)]
    return StageRequest(ctx.request_id, params=None, inputs=GenerationInputs(as_segments(segments)))


def decoder_input(ctx: StageInputContext) -> StageRequest:
    from omnistage.families.whisper.decoding import decoder_prompt
    from omnistage.families.whisper.segments import segment_bounds

    prompt = ctx.prompt if isinstance(ctx.prompt, AudioPrompt) else AudioPrompt(audio=None)
    model = ctx.resources
    config, tokenizer = model.generation_config, model.tokenizer
    ids = decoder_prompt(config, tokenizer, prompt.language, prompt.task, prompt.prompt)
    hidden = ctx.upstream[0].tensor(ENCODER_KEY)
    rows = model.encoder_positions
    states = list(hidden.reshape(-1, rows, hidden.shape[-1]))
    params = ctx.params if isinstance(ctx.params, SamplingParams) else SamplingParams(temperature=0.0)
    params = msgspec.structs.replace(params, n=len(states))
    bounds = segment_bounds(_audio(prompt))
    segments = [(a / SAMPLE_RATE, b / SAMPLE_RATE) for a, b in bounds]
    inputs = ARInputs(encoder_hidden_states=states, output_data={"segments": segments})
    return StageRequest(ctx.request_id, prompt=ids, params=params, inputs=inputs)


# ---- topology --------------------------------------------------------------------------------------------
STAGES = (
    StageSpec(
        stage_id=0,
        name="encoder",
        kind=StageKind.GENERATION,
        input_processor=encoder_input,
        engine_args={
            "generator": f"{_MODELS}.encoder:create_generator",
            "output_key": ENCODER_KEY,
        },
    ),
    StageSpec(
        stage_id=1,
        name="decoder",
        kind=StageKind.AR,
        inputs=(0,),
        final_output=True,
        output_modality="text",
        input_processor=decoder_input,
        default_params={"temperature": 0.0, "max_tokens": None},  # greedy, up to the 448 positions
        engine_args={"model_loader": f"{_MODELS}.decoder:load_decoder", "enable_prefix_caching": False},
    ),
)


def _capabilities(translates: bool) -> Capabilities:
    routes = ("transcriptions", "translations") if translates else ("transcriptions",)
    # OpenAI's upload limit (25 MB); 30 minutes of audio is 60 segments decoded side by side.
    limits = Limits(max_audio_seconds=1800.0, max_upload_bytes=25 * 1024 * 1024)
    return Capabilities(routes=routes, prompt="audio", fields={"sampling": (1,)}, limits=limits)


WHISPER = PipelineSpec(
    name="whisper",
    stages=STAGES,
    default_deploy=str(HERE / "whisper.yaml"),
    family=FAMILY,
    capabilities=_capabilities(True),
)
WHISPER_EN = PipelineSpec(
    name="whisper_en",
    stages=STAGES,
    default_deploy=str(HERE / "whisper.yaml"),
    family=FAMILY,
    capabilities=_capabilities(False),
)


def resolve(info: ModelInfo) -> PipelineSpec | None:
    """transformers Whisper directories; English-only ones (vocabulary < 51865) cannot translate."""
    if info.model_type != "whisper" and "WhisperForConditionalGeneration" not in info.architectures:
        return None
    return WHISPER if int((info.config or {}).get("vocab_size", 0)) >= 51865 else WHISPER_EN
