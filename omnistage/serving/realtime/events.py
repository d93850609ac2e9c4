"""The client's events and the session's configuration, as the OpenAI GA realtime API defines them.

Everything a client sends is validated here, so a bad event becomes one `error` event naming the field
(`BadEvent`) and never reaches the session's state. Fields omnistage does not implement are refused by name
rather than silently ignored, except the few a stock client always sends (tracing, include, truncation).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from omnistage.serving.errors import field_path
from omnistage.serving.protocol import FUNCTION_NAME_PATTERN

SAMPLE_RATE = 24000  # the API's pcm16 rate, in and out
CLIENT_EVENTS = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "response.create",
    "response.cancel",
)


class BadEvent(Exception):
    """A client event the session refuses: becomes an `error` event, the session goes on."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AudioFormat(_Strict):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = SAMPLE_RATE


class Transcription(_Strict):
    model: str | None = None
    language: str | None = None
    prompt: str | None = None


class TurnDetection(_Strict):
    type: Literal["server_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=0, le=10_000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: None = None


class AudioInput(_Strict):
    format: AudioFormat = AudioFormat()
    transcription: Transcription | None = None
    turn_detection: TurnDetection | None = TurnDetection()
    noise_reduction: None = None


class AudioOutput(_Strict):
    format: AudioFormat = AudioFormat()
    voice: str | None = None
    speed: Literal[1.0] = 1.0


class Audio(_Strict):
    input: AudioInput = AudioInput()
    output: AudioOutput = AudioOutput()


class RealtimeTool(_Strict):
    """A function the model may call (the realtime API's flat form of a chat `tools` entry)."""

    type: Literal["function"] = "function"
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None

    def as_chat_tool(self) -> dict[str, Any]:
        function = self.model_dump(exclude={"type"}, exclude_none=True)
        return {"type": "function", "function": function}


class ToolChoiceFunction(_Strict):
    type: Literal["function"]
    name: str


ToolChoice = Literal["auto", "none", "required"] | ToolChoiceFunction


def _chosen_tool_is_listed(choice: Any, tools: list[RealtimeTool] | None) -> Any:
    if isinstance(choice, ToolChoiceFunction) and tools is not None:
        names = [t.name for t in tools]
        if choice.name not in names:
            raise ValueError(
                f"function {choice.name!r} is not one of the tools ({', '.join(names) or 'none'})"
            )
    return choice


class SessionConfig(_Strict):
    """The `session` object. `temperature`, `seed` and `stage_params` are omnistage's (GA has no sampling
    fields): with them a session answers reproducibly; `stage_params[i]` reaches stage i, as in chat."""

    type: Literal["realtime"] = "realtime"
    id: str | None = None
    object: str | None = None
    model: str | None = None
    output_modalities: list[Literal["text", "audio"]] = ["audio"]
    instructions: str | None = None
    audio: Audio = Audio()
    max_output_tokens: int | Literal["inf"] = Field("inf")
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    seed: int | None = None
    stage_params: list[dict[str, Any] | None] | None = None
    tools: list[RealtimeTool] = Field([], max_length=128)
    tool_choice: ToolChoice = "auto"
    tracing: Any = None
    include: Any = None
    truncation: Any = None
    prompt: None = None
    expires_at: Any = None

    @field_validator("output_modalities")
    @classmethod
    def _one_modality(cls, value: list[str]) -> list[str]:
        if len(value) != 1:
            raise ValueError("must be ['audio'] (audio with its transcript) or ['text']")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _listed(cls, value: Any, info: ValidationInfo) -> Any:
        return _chosen_tool_is_listed(value, info.data.get("tools"))

    @field_validator("max_output_tokens")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= 4096:
            raise ValueError("must be 'inf' or an integer in [1, 4096]")
        return value

    @property
    def speaks(self) -> bool:
        return self.output_modalities == ["audio"]

    @property
    def max_tokens(self) -> int | None:
        return None if self.max_output_tokens == "inf" else int(self.max_output_tokens)

    def updated(self, fields: dict[str, Any], where: str = "session") -> SessionConfig:
        """This config with `fields` (a partial session object) merged in, key by key."""
        return validated(SessionConfig, _merge(self.model_dump(), fields), where)

    def public(self, session_id: str) -> dict[str, Any]:
        data = self.model_dump(exclude={"temperature", "seed", "stage_params", "expires_at"})
        return {**data, "id": session_id, "object": "realtime.session"}


class ResponseOptions(_Strict):
    """`response.create`'s `response`: what this one response changes from the session."""

    output_modalities: list[Literal["text", "audio"]] | None = None
    instructions: str | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    conversation: Literal["auto"] | None = None
    metadata: dict[str, str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    audio: dict[str, Any] | None = None
    tools: list[RealtimeTool] | None = Field(None, max_length=128)  # None: the session's
    tool_choice: ToolChoice | None = None

    @field_validator("tool_choice")
    @classmethod
    def _listed(cls, value: Any, info: ValidationInfo) -> Any:
        return _chosen_tool_is_listed(value, info.data.get("tools"))


class ContentPart(_Strict):
    type: Literal["input_text", "input_audio", "text", "output_text"]
    text: str | None = None
    audio: str | None = None
    transcript: str | None = None


class MessageItem(_Strict):
    id: str | None = None
    type: Literal["message"] = "message"
    object: str | None = None
    status: str | None = None
    role: Literal["user", "assistant", "system"]
    content: list[ContentPart]


class FunctionCallItem(_Strict):
    """A call the client adds to the conversation (one it made itself, or replays)."""

    id: str | None = None
    type: Literal["function_call"]
    object: str | None = None
    status: str | None = None
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    call_id: str | None = None
    arguments: str


class FunctionCallOutputItem(_Strict):
    """The result of a call the model made, which the next response reads."""

    id: str | None = None
    type: Literal["function_call_output"]
    object: str | None = None
    status: str | None = None
    call_id: str = Field(min_length=1)
    output: str


def _merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def validated(cls: type[BaseModel], data: Any, where: str) -> Any:
    """`cls` from `data`, or a BadEvent naming the first bad field (as `where.path.to.field`)."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        path = field_path(first.get("loc", ()))
        param = f"{where}.{path}" if path else where
        raise BadEvent(f"{param}: {first['msg']}", param) from None


def parse_event(frame: dict[str, Any]) -> dict[str, Any]:
    """A client frame as an event dict with a known `type`; BadEvent otherwise."""
    if frame.get("text") is None:
        raise BadEvent("events must be JSON text frames, not binary", None, "invalid_event")
    try:
        event = json.loads(frame["text"])
    except json.JSONDecodeError as exc:
        raise BadEvent(f"event is not valid JSON ({exc.msg})", None, "invalid_json") from None
    if not isinstance(event, dict):
        raise BadEvent("an event must be a JSON object with a `type`", "type", "invalid_event")
    kind = event.get("type")
    if kind not in CLIENT_EVENTS:
        known = ", ".join(CLIENT_EVENTS)
        raise BadEvent(f"type: unknown event type {kind!r} (known: {known})", "type", "invalid_event")
    return event
