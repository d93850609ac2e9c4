"""The session's conversation: the items a response is prompted with, and their API form."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import numpy as np

from omnistage.serving.chat_prompt import ChatBuilder
from omnistage.serving.realtime.events import SAMPLE_RATE


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclasses.dataclass
class Item:
    """One message. A user's audio item carries its samples; its transcript arrives later (`heard`)."""

    id: str
    role: str
    kind: str  # input_audio | input_text | output_audio | output_text
    text: str | None = None
    audio: np.ndarray | None = None
    heard: asyncio.Future | None = None  # the transcript of an audio item, when one is being made

    def public(self, status: str = "completed") -> dict[str, Any]:
        text_key = "transcript" if self.kind.endswith("audio") else "text"
        part = {"type": self.kind, text_key: self.text}
        return {
            "id": self.id,
            "type": "message",
            "object": "realtime.item",
            "status": status,
            "role": self.role,
            "content": [part],
        }


class Conversation:
    def __init__(self) -> None:
        self.items: list[Item] = []

    @property
    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None

    def add(self, item: Item) -> str | None:
        """Adds `item` at the end; the id of the item before it."""
        previous = self.last_id
        self.items.append(item)
        return previous

    async def prompt(self, instructions: str | None, hears_audio: bool) -> ChatBuilder:
        """The chat prompt of the whole conversation: a user's audio as audio for a model that hears it,
        else as its transcript (waiting for it)."""
        chat = ChatBuilder()
        if instructions:
            chat.messages.append({"role": "system", "content": instructions})
        for item in self.items:
            if item.kind == "input_audio" and hears_audio:
                chat.media["audio"].append((item.audio, SAMPLE_RATE))
                chat.messages.append({"role": item.role, "content": [{"type": "audio"}]})
                continue
            if item.kind == "input_audio" and item.text is None and item.heard is not None:
                item.text = await asyncio.shield(item.heard)
            chat.messages.append({"role": item.role, "content": item.text or ""})
        return chat
