"""Request bodies of the OpenAI-compatible routes, with OpenAI's field names.

Schema rules (types, ranges, enumerations) live here so that a bad field is a 400 naming it before any
work starts. Rules that need the model (which modalities it has, its size limits) are checked by the
routes. Unknown fields are accepted and ignored, as OpenAI clients send fields a server may not know.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SEED_MAX = 2**63 - 1
TOKENS_MAX = 2**31 - 1
SIZE_PATTERN = r"^[1-9][0-9]{0,5}x[1-9][0-9]{0,5}$"

Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
StageParamsList = list[dict[str, Any] | None]


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, protected_namespaces=())


# ---- chat ------------------------------------------------------------------------------------------
class MediaURL(OpenAIModel):
    url: str
    detail: str | None = None


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ImageURLPart(OpenAIModel):
    type: Literal["image_url"]
    image_url: MediaURL


class InputAudio(OpenAIModel):
    data: str
    format: str = "wav"


class InputAudioPart(OpenAIModel):
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioURLPart(OpenAIModel):
    type: Literal["audio_url"]
    audio_url: MediaURL


class VideoURLPart(OpenAIModel):
    type: Literal["video_url"]
    video_url: MediaURL


ContentPart = Annotated[
    TextPart | ImageURLPart | InputAudioPart | AudioURLPart | VideoURLPart, Field(discriminator="type")
]


FUNCTION_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"  # OpenAI's rule for function names


class FunctionCall(OpenAIModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(OpenAIModel):
    """A call the assistant made, as a client sends it back in the history."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers


class FunctionDefinition(OpenAIModel):
    name: str = Field(pattern=FUNCTION_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; None: no arguments
    strict: bool | None = None


class Tool(OpenAIModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(OpenAIModel):
    name: str


class NamedToolChoice(OpenAIModel):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class AudioOutputOptions(OpenAIModel):
    """OpenAI's `audio` request field: which voice, and the container of the returned audio."""

    voice: str | dict[str, Any] | None = None
    format: Literal["wav", "pcm", "pcm16", "flac", "mp3", "opus"] = "wav"


class JsonSchemaFormat(OpenAIModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = Field("response", min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIModel):
    """OpenAI's `response_format` for text answers: plain text, any JSON object, or a JSON schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(OpenAIModel):
    """Sampling fields shared by chat and completions (OpenAI's plus vLLM's usual extensions)."""

    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=TOKENS_MAX)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    max_tokens: int | None = Field(None, ge=1, le=TOKENS_MAX)
    min_tokens: int | None = Field(None, ge=0, le=TOKENS_MAX)
    n: int = Field(1, ge=1, le=16)
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, le=TOKENS_MAX)]] | None = None
    seed: Seed | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # One entry per stage (None: the stage's defaults); overrides the top-level fields for that stage.
    stage_params: StageParamsList | None = None
    # Structured outputs (serving/structured_outputs.py): OpenAI's, vLLM's, and vLLM's older guided_* names.
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class DiffusionFields(OpenAIModel):
    """Generation settings for image and video outputs, shared by chat and the image/video routes."""

    size: str | None = Field(None, pattern=SIZE_PATTERN)
    height: int | None = Field(None, ge=1, le=65536)
    width: int | None = Field(None, ge=1, le=65536)
    negative_prompt: str | None = None
    num_inference_steps: int | None = Field(None, ge=1, le=200)
    guidance_scale: float | None = Field(None, ge=0.0, le=20.0)
    guidance_scale_2: float | None = Field(None, ge=0.0, le=20.0)  # a two-expert model's low-noise expert
    true_cfg_scale: float | None = Field(None, ge=0.0, le=20.0)
    # Model-specific knobs (a model takes those its capabilities' `diffusion_options` list).
    flow_shift: float | None = Field(None, gt=0.0, le=100.0)
    boundary_ratio: float | None = Field(None, gt=0.0, lt=1.0)
    # A LoRA adapter for this request (serving/loras.py: vLLM-Omni's flexible keys, checked there).
    lora: dict[str, Any] | None = None


class ChatCompletionRequest(SamplingFields, DiffusionFields):
    # An example for the OpenAPI page (and the first request schemathesis sends, tests/serving).
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [{"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16}]
        }
    )

    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["text", "audio", "image", "video"]] | None = Field(None, min_length=1)
    audio: AudioOutputOptions | None = None
    speaker: str | None = None
    voice: str | None = None
    max_completion_tokens: int | None = Field(None, ge=1, le=TOKENS_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    num_outputs_per_prompt: int | None = Field(None, ge=1, le=10)
    # Function calling (serving/tool_calls.py); 128 tools at most, as OpenAI allows.
    tools: list[Tool] | None = Field(None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    # Generation parameters as curl users nest them (the SDK flattens `extra_body=` to the top level).
    extra_body: dict[str, Any] | None = None


# ---- completions -----------------------------------------------------------------------------------
TokenId = Annotated[int, Field(ge=0, le=TOKENS_MAX)]


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    # Unset: OpenAI's default of 16 (routes/completions.py), under the model's own defaults.
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1, le=16)


# ---- speech ----------------------------------------------------------------------------------------
AudioFormat = Literal["wav", "pcm", "flac", "mp3", "opus", "aac"]


INPUT_MAX = 4096  # characters of speech input: the OpenAI API's limit
BATCH_MAX_ITEMS = 32
VOICE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"  # also a safe file name


class SpeechFields(OpenAIModel):
    """What to say it with: the fields a speech batch or WebSocket session sets once for every input."""

    model: str | None = None
    voice: str | dict[str, Any] | None = None
    speaker: str | None = None
    instructions: str | None = Field(None, max_length=INPUT_MAX)
    response_format: AudioFormat = "wav"
    sample_rate: int | None = Field(None, ge=8000, le=96000)
    speed: float = Field(1.0, ge=0.25, le=4.0)
    seed: Seed | None = None
    language: str | None = None
    max_new_tokens: int | None = Field(None, ge=1, le=TOKENS_MAX)
    stage_params: StageParamsList | None = None
    # Any other field is a family's own option: a model takes those its capabilities declare, typed
    # (`speech_options`), and any other one set is a 400 naming it (serving/speech_requests.py).

    def options(self) -> dict[str, Any]:
        """The fields set beyond the OpenAI ones: a family's options, as the client sent them."""
        return {k: v for k, v in (self.model_extra or {}).items() if v is not None}


class SpeechRequest(SpeechFields):
    input: str = Field(max_length=INPUT_MAX)
    stream: bool = False
    stream_format: Literal["sse", "audio"] | None = None
    stage_params: StageParamsList | None = None

    @property
    def streaming(self) -> bool:
        return self.stream or self.stream_format is not None

    @property
    def voice_name(self) -> str | None:
        if isinstance(self.voice, dict):
            return str(self.voice.get("id") or self.voice.get("name") or "") or None
        return self.voice or self.speaker


class BatchSpeechRequest(SpeechFields):
    """Up to 32 inputs at once; each item needs `input` and may override any batch-level field. Items are
    checked one by one (a bad item is that item's error, never the batch's)."""

    items: list[dict[str, Any]] = Field(min_length=1, max_length=BATCH_MAX_ITEMS)


class SpeechSessionConfig(SpeechFields):
    """`session.config` of the speech WebSocket: the speech fields, and whether each sentence's audio is
    sent as it is made (`stream_audio`, PCM or WAV) or whole."""

    type: Literal["session.config"]
    stream_audio: bool = False

    def speech(self, text: str) -> SpeechRequest:
        fields = self.model_dump(exclude_unset=True, exclude={"type", "stream_audio"})
        return SpeechRequest.model_validate({**fields, "input": text, "stream": self.stream_audio})


class VoiceUploadForm(OpenAIModel):
    """The text fields of `POST /v1/audio/voices` (the sample is the `audio_sample` file)."""

    name: str = Field(pattern=VOICE_NAME_PATTERN)
    consent: str = Field(min_length=1, max_length=INPUT_MAX)
    ref_text: str | None = Field(None, max_length=INPUT_MAX)


class AudioGenerateRequest(OpenAIModel):
    """Text to audio (sound, music) with a diffusion pipeline."""

    model: str | None = None
    input: str = Field(max_length=INPUT_MAX)
    response_format: AudioFormat = "wav"
    audio_length: float | None = Field(None, ge=0.001, le=3600.0)  # seconds (1 ms: a sample at >= 1 kHz)
    negative_prompt: str | None = Field(None, max_length=INPUT_MAX)
    guidance_scale: float | None = Field(None, ge=0.0, le=20.0)
    num_inference_steps: int | None = Field(None, ge=1, le=200)
    seed: Seed | None = None


# ---- images ----------------------------------------------------------------------------------------
class ImageFields(DiffusionFields):
    model: str | None = None
    prompt: str
    n: int = Field(1, ge=1, le=10)
    size: str | None = Field(None, pattern=SIZE_PATTERN + "|^auto$")
    response_format: Literal["b64_json", "url"] | None = "b64_json"
    output_format: Literal["png", "jpeg", "jpg", "webp"] = "png"
    output_compression: int | None = Field(None, ge=0, le=100)
    seed: Seed | None = None
    background: str | None = None
    quality: str | None = None
    user: str | None = None
    stage_params: StageParamsList | None = None


class ImageGenerationRequest(ImageFields):
    style: str | None = None


class ImageEditForm(ImageFields):
    """The non-file fields of the multipart edit form (files are read separately)."""

    strength: float | None = Field(None, ge=0.0, le=1.0)


# ---- videos ----------------------------------------------------------------------------------------
class VideoCreateRequest(DiffusionFields):
    model: str | None = None
    prompt: str
    seconds: str | None = Field(None, pattern=r"^[1-9][0-9]{0,3}$")
    size: str | None = Field(None, pattern=SIZE_PATTERN)
    num_frames: int | None = Field(None, ge=1, le=1024)
    fps: int | None = Field(None, ge=1, le=120)
    seed: Seed | None = None
    # In JSON bodies: an image as a data URL (or an allowed local path); multipart sends a file instead.
    input_reference: str | None = None
    user: str | None = None
    stage_params: StageParamsList | None = None


class VideoError(BaseModel):
    code: str
    message: str


class VideoJob(BaseModel):
    """A video job as clients see it and as the job store keeps it on disk."""

    id: str
    object: Literal["video"] = "video"
    model: str
    prompt: str
    status: Literal["queued", "in_progress", "completed", "failed"] = "queued"
    progress: int = 0
    size: str
    seconds: str
    quality: str = "default"
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    error: VideoError | None = None
    remixed_from_video_id: str | None = None
    media_type: str = "video/mp4"
    file_name: str | None = None
    inference_time_s: float | None = None


class ChatDiffusionExtras(DiffusionFields):
    """Generation fields a chat request may nest under `extra_body` (curl) instead of the top level."""

    seed: Seed | None = None
    num_outputs_per_prompt: int | None = Field(None, ge=1, le=10)
