"""Typed prompts: what a request asks of a pipeline, by shape, from the server's routes and the Python API to
every stage's input processor.

- `TextPrompt`: text to continue, or its token ids (completions; a diffusion model's caption and negative
  prompt), with media for the placeholders in the text (vLLM's `{"prompt": ..., "multi_modal_data": ...}`).
- `ChatPrompt`: messages in chat-template form (media parts as `{"type": "image"}` placeholders) and the
  decoded media in the order they appear; `speaker` for models that answer in speech.
- `SpeechPrompt`: text to say, with the OpenAI speech fields and the family's own typed options.
- `AudioPrompt`: audio to transcribe or translate (mono float32 at 16 kHz).

They cross process boundaries as tagged msgspec structs (their media as payloads: runtime/messages.py).
`as_prompt` turns what a Python API user may pass (a string, token ids, vLLM's prompt dicts) into one.
"""

from __future__ import annotations

from typing import Any

import msgspec

from omnistage.errors import InvalidRequestError


class WithMedia(msgspec.Struct, kw_only=True):
    """Images (PIL or uint8 [H, W, 3]), audio clips (waveforms, or (samples, rate) pairs) and videos (uint8
    frames [F, H, W, 3]) that a prompt's placeholders stand for, in order."""

    images: list[Any] = []
    audios: list[Any] = []
    videos: list[Any] = []

    def media(self) -> dict[str, list[Any]]:
        """The media by kind, as vLLM's `multi_modal_data` names them (only the kinds present)."""
        found = {"image": self.images, "audio": self.audios, "video": self.videos}
        return {kind: items for kind, items in found.items() if items}


class TextPrompt(WithMedia, tag="text", kw_only=True):
    text: str | None = None
    token_ids: list[int] | None = None
    # The text is already in the model's prompt format (vLLM's `{"prompt": ...}`); a plain string is a
    # chat family's user message (a plain LLM continues either as is).
    templated: bool = False
    speaker: str | None = None  # the voice of a model that answers in speech
    negative_prompt: str | None = None  # what a diffusion model steers away from


class ChatPrompt(WithMedia, tag="chat", kw_only=True):
    messages: list[dict[str, Any]]
    speaker: str | None = None  # the voice of a model that answers in speech
    # Functions the model may call, in OpenAI's `tools` form (omnistage/tool_prompts.py writes them in).
    tools: list[dict[str, Any]] | None = None


class UploadedVoice(msgspec.Struct, kw_only=True):
    """A voice from the server's store, for a family that clones: its file, read in the stage."""

    name: str
    path: str
    sample_rate: int
    ref_text: str | None = None


class SpeechPrompt(msgspec.Struct, tag="speech", kw_only=True):
    input: str
    speaker: str | None = None
    instructions: str | None = None
    language: str | None = None
    speed: float | None = None  # set for a model that speaks at the asked speed itself
    uploaded_voice: UploadedVoice | None = None
    options: dict[str, Any] = {}  # the family's own options, checked against their declared types

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The text as a user message: what a chat-capable pipeline (an omni thinker) reads."""
        return [{"role": "user", "content": self.input}]


class AudioPrompt(msgspec.Struct, tag="audio", kw_only=True):
    audio: Any  # mono float32 samples at 16 kHz
    language: str | None = None
    task: str = "transcribe"  # or "translate"
    prompt: str | None = None  # text that came before, to continue from


Prompt = TextPrompt | ChatPrompt | SpeechPrompt | AudioPrompt
PROMPTS = (TextPrompt, ChatPrompt, SpeechPrompt, AudioPrompt)


def as_prompt(value: Any) -> Prompt:
    """A typed prompt from what a Python API user may pass: a prompt already, a string, token ids, or one of
    vLLM's prompt dicts (`{"prompt": ..., "multi_modal_data": {...}}`, `{"prompt_token_ids": [...]}`,
    `{"messages": [...]}`), or the dict forms of the others (`{"input": ...}` speech, `{"audio": ...}`)."""
    if isinstance(value, PROMPTS):
        return value
    if isinstance(value, str):
        return TextPrompt(text=value)
    if isinstance(value, list | tuple) and all(isinstance(t, int) for t in value):
        return TextPrompt(token_ids=list(value))
    if not isinstance(value, dict):
        raise InvalidRequestError(
            f"a prompt is a string, token ids, a dict or a typed prompt, got {type(value).__name__}",
            param="prompt",
        )
    media = value.get("multi_modal_data") or {}
    if not isinstance(media, dict):
        raise InvalidRequestError(
            "multi_modal_data must be a mapping of media by kind", param="multi_modal_data"
        )
    unknown = sorted(set(media) - {"image", "audio", "video"})
    if unknown:
        raise InvalidRequestError(
            f"multi_modal_data takes image, audio and video, not {', '.join(map(str, unknown))}",
            param="multi_modal_data",
        )
    if "messages" in value and "input" not in value:
        return ChatPrompt(messages=list(value["messages"]), speaker=value.get("speaker"), **_media(media))
    if "input" in value:
        known = {
            "input",
            "speaker",
            "instructions",
            "language",
            "speed",
            "uploaded_voice",
            "messages",
            "task",
        }
        voice = value.get("uploaded_voice")
        return SpeechPrompt(
            input=str(value["input"]),
            speaker=value.get("speaker"),
            instructions=value.get("instructions"),
            language=value.get("language"),
            speed=value.get("speed"),
            uploaded_voice=msgspec.convert(voice, UploadedVoice) if isinstance(voice, dict) else voice,
            options={k: v for k, v in value.items() if k not in known},
        )
    if "audio" in value:
        return AudioPrompt(
            audio=value["audio"],
            language=value.get("language"),
            task=value.get("task") or "transcribe",
            prompt=value.get("prompt"),
        )
    if "prompt_token_ids" in value or isinstance(value.get("prompt"), str):
        ids = value.get("prompt_token_ids")
        return TextPrompt(
            text=None if ids is not None else value["prompt"],
            token_ids=None if ids is None else list(ids),
            templated=True,
            speaker=value.get("speaker"),
            negative_prompt=value.get("negative_prompt"),
            **_media(media),
        )
    raise InvalidRequestError(
        "a dict prompt needs 'messages', 'input', 'audio', 'prompt' or 'prompt_token_ids'", param="prompt"
    )


def prompt_text(prompt: Prompt) -> str:
    """The prompt's text, for stages that read text only (a diffusion model's caption, a voice's input)."""
    if isinstance(prompt, TextPrompt):
        return prompt.text or ""
    if isinstance(prompt, SpeechPrompt):
        return prompt.input
    if isinstance(prompt, ChatPrompt):
        for message in reversed(prompt.messages):
            if message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    return content
                return "\n".join(p.get("text", "") for p in content or [] if p.get("type") == "text")
        return ""
    return prompt.prompt or ""


def _media(media: dict[str, Any]) -> dict[str, list[Any]]:
    return {
        "images": _items(media.get("image")),
        "audios": _audio_items(media.get("audio")),
        "videos": _items(media.get("video")),
    }


def _items(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


def _audio_items(value: Any) -> list[Any]:
    """Audio clips: one waveform, a (samples, sample rate) pair, or a list of either."""
    if value is None:
        return []
    pair = isinstance(value, tuple | list) and len(value) == 2 and isinstance(value[1], int | float)
    return list(value) if isinstance(value, list) and not pair else [value]
