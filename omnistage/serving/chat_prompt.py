"""Chat messages → the runtime's typed chat prompt (omnistage/prompts.py).

Media parts are fetched and decoded here (under the server's media policy) and replaced in the message by
a typed placeholder (`{"type": "image"}`, `{"type": "audio"}`, `{"type": "video"}`), the form Hugging Face
chat templates expect; the decoded media go to `multi_modal_data` in the order they appear. Text-only
content is joined into one string, since many chat templates only take strings.
"""

from __future__ import annotations

import asyncio
from typing import Any

from omnistage.config.capabilities import Limits
from omnistage.errors import InvalidRequestError
from omnistage.prompts import ChatPrompt
from omnistage.serving.limits import check_audio, check_upload
from omnistage.serving.media import decode_audio, decode_image, decode_video
from omnistage.serving.media_sources import MediaSources, decode_base64
from omnistage.serving.protocol import (
    AudioURLPart,
    ChatMessage,
    ImageURLPart,
    InputAudioPart,
    TextPart,
    VideoURLPart,
)
from omnistage.serving.settings import ServerSettings

MAX_VIDEO_FRAMES = 64
ROLE_ALIASES = {"developer": "system"}


class ChatBuilder:
    """Messages in template form plus decoded media, as the request's parts are read."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.media: dict[str, list[Any]] = {"image": [], "audio": [], "video": []}

    def as_prompt(self, speaker: str | None = None, tools: list[dict[str, Any]] | None = None) -> ChatPrompt:
        media = self.media
        return ChatPrompt(
            messages=self.messages,
            images=media["image"],
            audios=media["audio"],
            videos=media["video"],
            speaker=speaker,
            tools=tools,
        )

    def last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message["role"] == "user":
                content = message["content"]
                if isinstance(content, str):
                    return content
                return "\n".join(p["text"] for p in content if p["type"] == "text")
        return ""


async def build_chat_prompt(
    messages: list[ChatMessage], media: MediaSources, settings: ServerSettings, limits: Limits | None = None
) -> ChatBuilder:
    """`limits`: the model's (upload bytes, input audio seconds), checked as each part is read."""
    prompt = ChatBuilder()
    limits = limits or Limits()
    for i, message in enumerate(messages):
        role = ROLE_ALIASES.get(message.role, message.role)
        if message.content is None or isinstance(message.content, str):
            entry: dict[str, Any] = {"role": role, "content": message.content or ""}
        else:
            parts = []
            for j, part in enumerate(message.content):
                where = f"messages[{i}].content[{j}]"
                parts.append(await _convert_part(part, where, prompt, media, settings, limits))
            if all(p["type"] == "text" for p in parts):
                entry = {"role": role, "content": "".join(p["text"] for p in parts)}
            else:
                entry = {"role": role, "content": parts}
        prompt.messages.append(_with_tool_fields(entry, message, i, prompt.messages))
    return prompt


def _with_tool_fields(
    entry: dict[str, Any], message: ChatMessage, index: int, before: list[dict[str, Any]]
) -> dict[str, Any]:
    """An assistant's tool calls and a tool result's call id (and function name, which some templates
    print), in the form chat templates read."""
    if message.tool_calls and message.role == "assistant":
        entry["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for call in message.tool_calls
        ]
    if message.role == "tool":
        if not message.tool_call_id:
            param = f"messages[{index}].tool_call_id"
            raise InvalidRequestError(f"{param}: required for a tool message", param=param)
        entry["tool_call_id"] = message.tool_call_id
        names = {c["id"]: c["function"]["name"] for m in before for c in m.get("tool_calls") or ()}
        if message.tool_call_id in names:
            entry["name"] = names[message.tool_call_id]
    return entry


async def _convert_part(
    part: Any, where: str, prompt: ChatBuilder, media: MediaSources, settings: ServerSettings, limits: Limits
) -> dict[str, Any]:
    pixels = settings.max_image_pixels

    async def read(url: str, param: str) -> bytes:
        data, _ = await media.read(url, param=param)
        check_upload(len(data), limits, param)
        return data

    def audio(data: bytes, param: str) -> Any:
        decoded = decode_audio(data, param=param)
        check_audio(decoded[0], decoded[1], limits, param)
        return decoded

    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImageURLPart):
        param = f"{where}.image_url.url"
        data = await read(part.image_url.url, param)
        prompt.media["image"].append(
            await asyncio.to_thread(decode_image, data, max_pixels=pixels, param=param)
        )
        return {"type": "image"}
    if isinstance(part, InputAudioPart):
        param = f"{where}.input_audio.data"
        data = decode_base64(part.input_audio.data, param=param)
        check_upload(len(data), limits, param)
        prompt.media["audio"].append(await asyncio.to_thread(audio, data, param))
        return {"type": "audio"}
    if isinstance(part, AudioURLPart):
        param = f"{where}.audio_url.url"
        prompt.media["audio"].append(
            await asyncio.to_thread(audio, await read(part.audio_url.url, param), param)
        )
        return {"type": "audio"}
    if isinstance(part, VideoURLPart):
        param = f"{where}.video_url.url"
        data = await read(part.video_url.url, param)
        video = await asyncio.to_thread(
            decode_video, data, max_pixels=pixels, max_frames=MAX_VIDEO_FRAMES, param=param
        )
        prompt.media["video"].append(video)
        return {"type": "video"}
    raise TypeError(f"unhandled content part {type(part).__name__}")
