"""What a pipeline serves, declared by its family: the routes, the prompt its entry stage takes, which stage
gets which request fields, its limits and its voices.

The HTTP layer reads only this object, never the stages' kinds or names, so a new family is served by
declaring its `Capabilities` in its own file. A pipeline that declares none gets one derived from its
topology (`derive_capabilities`), which is how user pipelines keep working unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from omnistage.errors import ConfigError

if TYPE_CHECKING:
    from omnistage.config.pipeline import PipelineSpec

# "realtime": the model hears a user's audio itself in a realtime session (`/v1/realtime`); a chat model
# without it is answered there from the transcript of a served transcription model.
ROUTES = ("chat", "completions", "speech", "images", "videos", "audio_generate", "realtime")
# What the entry stage takes: chat messages (a prompt dict with `messages` and media), plain text (the
# last user text, the speech input), or a speech prompt dict (`input`, `messages`, `speaker`, ...).
PROMPTS = ("chat", "text", "speech")
# Speech in, text out: "transcriptions" (and "translations" into English) take an audio prompt dict
# (`audio` as 16 kHz float32 samples, `language`, `task`, `prompt`); the final text output may hold one
# choice per audio segment and `data["segments"]` (each one's start and end in seconds).
ROUTES += ("transcriptions", "translations")
PROMPTS += ("audio",)
# Request field groups and the params type each fills.
FIELD_GROUPS = ("sampling", "diffusion", "generation")
TOOL_PARSERS = ("hermes", "json")  # the readers of serving/tool_parsers.py
DIFFUSION_OPTIONS = ("flow_shift", "boundary_ratio", "guidance_scale_2")


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may ask of the model; None: no limit. A request past one is refused (400) before
    any work starts. The deploy YAML's `limits:` block lowers or raises them."""

    max_pixels: int | None = None  # width x height of a generated image or video frame
    max_width: int | None = None
    max_height: int | None = None
    max_frames: int | None = None
    max_steps: int | None = None  # num_inference_steps
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_audio_seconds: float | None = None  # of an input audio clip
    max_output_audio_seconds: float | None = None  # of generated audio (text-to-audio `audio_length`)
    max_upload_bytes: int | None = None  # of one uploaded or referenced media file

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise ConfigError(f"limits.{field.name} must be a number or null, got {value!r}")
            if value is not None and value <= 0:
                raise ConfigError(f"limits.{field.name} must be > 0, got {value}")

    def replaced(self, overrides: Mapping[str, Any] | None, where: str = "limits") -> Limits:
        """These limits with `overrides` (a deploy YAML block) on top; unknown keys are errors."""
        if not overrides:
            return self
        if not isinstance(overrides, Mapping):
            raise ConfigError(f"{where} must be a mapping of limit names to numbers")
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise ConfigError(f"unknown key {unknown[0]!r} in {where}; allowed keys: {', '.join(names)}")
        return dataclasses.replace(self, **overrides)


# Speech request fields only some families read (vLLM-Omni's names): task type, voice cloning from an inline
# clip, the first audio chunk's size.
@dataclasses.dataclass(frozen=True)
class SpeechOption:
    """A field of a speech request that a family declares and its stages read from the speech prompt:
    its name, its type (any annotation msgspec converts to, bounds through `Annotated[..., msgspec.Meta]`)
    and what it means. The speech routes check a request's value against the type (a 400 naming the field
    otherwise), and refuse any option the model does not declare. `media`: True, the value names audio (a
    data URL, or a local path the server's media policy allows) that the server reads; the prompt carries
    its bytes. A key instead: the value is a list of mappings, each naming its audio under that key (a
    conversation's earlier turns)."""

    name: str
    type: Any
    description: str = ""
    media: bool | str = False


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """The serving contract of one pipeline.

    `fields` maps each request field group onto the stages it goes to: "sampling" (temperature,
    max_tokens, ... as SamplingParams), "diffusion" (size, steps, guidance, ... as DiffusionParams),
    "generation" (the seed of single-pass generators). Stages not named keep their own defaults;
    `stage_params[i]` still reaches any stage.
    """

    routes: tuple[str, ...]
    prompt: str = "chat"
    fields: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    limits: Limits = Limits()
    voices: tuple[str, ...] = ()
    # The speed range the model speaks at itself (the speech prompt's `speed`); None: the server changes
    # the finished audio's speed (OpenAI's 0.25-4.0; not while streaming).
    speed_range: tuple[float, float] | None = None
    # Whether the model speaks in an uploaded voice (voice cloning); one that cannot refuses them.
    clones_voices: bool = False
    # Names in `voices` that are other names of one of its voices (OpenAI's names for a one-voice model).
    voice_aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # "module:function" called with the model directory at server start: the voices the checkpoint itself
    # holds (a speaker dictionary), listed and accepted beside `voices`.
    voices_of: str | None = None
    # The pipeline call argument that takes the length in seconds of generated audio (text-to-audio).
    audio_length_arg: str | None = None
    # The family's own fields of a speech request, typed, which its stages read from the speech prompt.
    speech_options: tuple[SpeechOption, ...] = ()
    # How the model writes tool calls in a chat reply (serving/tool_parsers.py: "hermes", "json"); None:
    # it takes no `tools` (its entry stage renders chat templates without them).
    tool_parser: str | None = None
    # The model-specific diffusion knobs it takes (`flow_shift`, `boundary_ratio`, `guidance_scale_2`): a
    # request setting one it does not list is a 400 naming it before any work starts.
    diffusion_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "routes", tuple(self.routes))
        object.__setattr__(self, "voices", tuple(self.voices))
        object.__setattr__(self, "fields", {k: tuple(v) for k, v in dict(self.fields).items()})
        object.__setattr__(self, "voice_aliases", dict(self.voice_aliases))
        object.__setattr__(self, "speech_options", tuple(self.speech_options))
        object.__setattr__(self, "diffusion_options", tuple(self.diffusion_options))
        bad = [o for o in self.diffusion_options if o not in DIFFUSION_OPTIONS]
        if bad:
            raise ConfigError(
                f"capabilities: unknown diffusion option {bad[0]!r} (known: {DIFFUSION_OPTIONS})"
            )
        bad = [o for o in self.speech_options if not isinstance(o, SpeechOption)]
        if bad:
            raise ConfigError(f"capabilities: speech option {bad[0]!r} is not a SpeechOption")
        bad = [r for r in self.routes if r not in ROUTES]
        if bad:
            raise ConfigError(f"capabilities: unknown route {bad[0]!r} (routes: {', '.join(ROUTES)})")
        if self.prompt not in PROMPTS:
            raise ConfigError(f"capabilities: prompt must be one of {PROMPTS}, got {self.prompt!r}")
        bad = [g for g in self.fields if g not in FIELD_GROUPS]
        if bad:
            raise ConfigError(f"capabilities: unknown field group {bad[0]!r} (groups: {FIELD_GROUPS})")
        bad = [a for a, v in self.voice_aliases.items() if a not in self.voices or v not in self.voices]
        if bad:
            raise ConfigError(f"capabilities: voice alias {bad[0]!r} and its voice must both be in voices")
        if self.tool_parser not in (None, *TOOL_PARSERS):
            raise ConfigError(
                f"capabilities: tool_parser must be one of {TOOL_PARSERS}, got {self.tool_parser!r}"
            )
        if self.voices_of is not None and ":" not in self.voices_of:
            raise ConfigError(f"capabilities: voices_of must be 'module:function', got {self.voices_of!r}")

    def speech_option(self, name: str) -> SpeechOption | None:
        return next((o for o in self.speech_options if o.name == name), None)

    def serves(self, route: str) -> bool:
        return route in self.routes

    def own_voices(self) -> tuple[str, ...]:
        """The distinct voices: `voices` without the aliases."""
        return tuple(v for v in self.voices if v not in self.voice_aliases)

    def stages_for(self, group: str) -> tuple[int, ...]:
        return self.fields.get(group, ())

    def with_limits(self, overrides: Mapping[str, Any] | None, where: str = "limits") -> Capabilities:
        return dataclasses.replace(self, limits=self.limits.replaced(overrides, where))

    def validate_for(self, pipeline: PipelineSpec) -> list[str]:
        """Stage ids that are not the pipeline's (a declaration that drifted from the topology)."""
        ids = {s.stage_id for s in pipeline.stages}
        return [
            f"capabilities.fields[{group!r}] names stage {sid}, which {pipeline.name!r} does not have"
            for group, stages in self.fields.items()
            for sid in stages
            if sid not in ids
        ]


def derive_capabilities(pipeline: PipelineSpec) -> Capabilities:
    """Capabilities read off the topology, for pipelines that declare none: an AR entry takes chat messages
    and the sampling fields, diffusion stages take the generation fields, generators the seed."""
    from omnistage.config.pipeline import StageKind

    entries = [s for s in pipeline.stages if not s.inputs]
    entry = min(entries, key=lambda s: s.stage_id)
    ar_entry = entry.kind is StageKind.AR
    modalities = pipeline.modalities
    routes = ["chat"]
    if ar_entry and "text" in modalities:
        routes.append("completions")
    for modality, route in (("audio", "speech"), ("image", "images"), ("video", "videos")):
        if modality in modalities:
            routes.append(route)
    if not ar_entry and "audio" in modalities:
        routes.append("audio_generate")  # audio from a text prompt
    fields = {
        "sampling": (entry.stage_id,) if ar_entry else (),
        "diffusion": tuple(s.stage_id for s in pipeline.stages if s.kind is StageKind.DIFFUSION),
        "generation": tuple(s.stage_id for s in pipeline.stages if s.kind is StageKind.GENERATION),
    }
    prompt = "chat" if ar_entry else "text"
    return Capabilities(routes=tuple(routes), prompt=prompt, fields={k: v for k, v in fields.items() if v})
