"""The hibari voice (`hibari-tts`): speech on its own, and as the voice of an LLM's spoken answers.

- `hibari_tts`: one generation stage speaks the request's text (`/v1/audio/speech`).
- `spoken_chat`: an LLM (AR) answers in text; with `modalities` asking for audio, the voice speaks the
  answer. In async chunk (the default deploy) the LLM's text reaches the voice unit by unit (a first clause,
  then sentences: units.py) while the LLM is still writing, so the first audio comes after the
  first clause instead of after the whole answer; full handoff speaks the finished answer.
  A text-only request never enters the voice stage.

A directory serves as the voice when its config.json says `"model_type": "hibari_tts"`; as a spoken chat
model when it says `"model_type": "spoken_chat"` and holds the LLM under `llm/` and the voice under `voice/`
(`omnistage.demo.voice` builds both for the demo).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec
import torch

from omnistage.config.capabilities import Capabilities
from omnistage.config.pipeline import PipelineSpec, StageKind, StageSpec
from omnistage.errors import InvalidRequestError
from omnistage.families.hibari.units import speech_units
from omnistage.families.hibari.voice import BUNDLED_VOICE, SPEED_RANGE, check_speed
from omnistage.outputs import StageOutput, TokenCounts
from omnistage.params import GenerationParams
from omnistage.prompts import ChatPrompt, SpeechPrompt, prompt_text
from omnistage.stages.base import StageInputContext, StageRequest
from omnistage.stages.generation.generation_inputs import GenerationInputs
from omnistage.tool_prompts import speakable

HERE = Path(__file__).parent
FAMILY = f"{__package__}:register"  # omnistage/families/registry.py

_VOICE = "omnistage.families.hibari.voice"
# The OpenAI API's voice names; this model has one voice, which answers to all of them.
OPENAI_VOICES = (
    "alloy",
    "ash",
    "ballad",
    "coral",
    "echo",
    "fable",
    "nova",
    "onyx",
    "sage",
    "shimmer",
    "verse",
)
VOICES = (BUNDLED_VOICE, *OPENAI_VOICES)
ALIASES = {name: BUNDLED_VOICE for name in OPENAI_VOICES}


# ---- processors (they run in the voice stage's process, next to the G2P) -------------------------------
def speech_input(ctx: StageInputContext) -> StageRequest:
    """The speech route's prompt: its `input` text, cut into units, each a frame of phoneme ids."""
    text = prompt_text(ctx.prompt)  # a speech prompt's input (or a Python API user's plain text)
    frames = _frames(ctx, speech_units(text, final=True, first=True)[0])
    if not len(frames):
        raise InvalidRequestError(
            "input: the voice found nothing it can say in this text (it speaks English)", param="input"
        )
    counts = TokenCounts(input_text_tokens=int((frames >= 0).sum()))  # the voice reads phonemes
    return StageRequest(
        ctx.request_id, params=voice_params(ctx), inputs=GenerationInputs(frames), token_counts=counts
    )


def reply_input(ctx: StageInputContext) -> StageRequest:
    """Full handoff: the LLM's finished answer (without its tool calls)."""
    text = ctx.upstream[0].text
    if _calls_tools(ctx):
        text, _ = speakable(text, final=True)
    units, _ = speech_units(text, final=True, first=True)
    return StageRequest(
        ctx.request_id, params=voice_params(ctx), inputs=GenerationInputs(_frames(ctx, units))
    )


def reply_chunk(
    ctx: StageInputContext, chunk: StageOutput, last: bool
) -> StageRequest | GenerationInputs | None:
    """Async chunk: each complete unit of the LLM's text, as soon as the text shows it is complete."""
    state = ctx.state
    text, held = state.get("text", "") + chunk.text, ""
    if _calls_tools(ctx):  # a tool call is read by the server, never said
        text, held = speakable(text, final=last)
    units, rest = speech_units(text, final=last, first=not state.get("spoken"))
    state["text"] = rest + held
    state["spoken"] = state.get("spoken", False) or bool(units)
    frames = _frames(ctx, units)
    if not state.get("started"):
        if not len(frames) and not last:
            return None
        state["started"] = True
        return StageRequest(ctx.request_id, params=voice_params(ctx), inputs=GenerationInputs(frames))
    return GenerationInputs(frames) if len(frames) or last else None


def _calls_tools(ctx: StageInputContext) -> bool:
    return isinstance(ctx.prompt, ChatPrompt) and bool(ctx.prompt.tools)


def _frames(ctx: StageInputContext, units: list[str]) -> torch.Tensor:
    rows = [ctx.resources.sentence_rows(unit) for unit in units]
    rows = [r for r in rows if len(r)]
    return torch.cat(rows) if rows else torch.empty((0, ctx.resources.width), dtype=torch.long)


def voice_params(ctx: StageInputContext) -> GenerationParams:
    """The request's seed (a random one if unset: every unit of a request must draw from one seed) and its
    speed (the prompt's `speed`, within the voice's range)."""
    params = ctx.params if isinstance(ctx.params, GenerationParams) else GenerationParams()
    asked = ctx.prompt.speed if isinstance(ctx.prompt, SpeechPrompt) else None
    speed = check_speed(float(asked if asked is not None else params.extra.get("speed", 1.0)))
    seed = params.seed if params.seed is not None else random.getrandbits(31)
    return msgspec.structs.replace(params, seed=seed, extra={**params.extra, "speed": speed})


# ---- topology --------------------------------------------------------------------------------------------
def _voice_stage(stage_id: int, **extra: Any) -> StageSpec:
    return StageSpec(
        stage_id=stage_id,
        name="voice",
        kind=StageKind.GENERATION,
        final_output=True,
        output_modality="audio",
        engine=f"{_VOICE}:create_engine",
        **extra,
    )


HIBARI_TTS = PipelineSpec(
    name="hibari_tts",
    stages=(_voice_stage(0, input_processor=speech_input),),
    model_types=("hibari_tts",),
    default_deploy=str(HERE / "hibari_tts.yaml"),
    family=FAMILY,
    capabilities=Capabilities(
        routes=("speech",),
        prompt="speech",
        fields={"generation": (0,)},
        voices=VOICES,
        voice_aliases=ALIASES,
        speed_range=SPEED_RANGE,
    ),
)

SPOKEN_CHAT = PipelineSpec(
    name="spoken_chat",
    stages=(
        StageSpec(
            stage_id=0,
            name="llm",
            kind=StageKind.AR,
            final_output=True,
            output_modality="text",
            model_subfolder="llm",
        ),
        _voice_stage(
            1,
            inputs=(0,),
            input_processor=reply_input,
            chunk_processor=reply_chunk,
            model_subfolder="voice",
        ),
    ),
    model_types=("spoken_chat",),
    default_deploy=str(HERE / "spoken_chat.yaml"),
    family=FAMILY,
    default_modalities=("text",),
    capabilities=Capabilities(
        routes=("chat", "completions"),
        prompt="chat",
        fields={"sampling": (0,), "generation": (1,)},
        voices=VOICES,
        voice_aliases=ALIASES,
        tool_parser="hermes",  # the LLM stage renders tools (omnistage/tool_prompts.py); never spoken
    ),
)
