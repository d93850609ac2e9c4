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
    """One message, function call or call's result. A user's audio item carries its samples; its
    transcript arrives later (`heard`). A call has its function's name, call id and arguments (JSON text);
    a result its call id and the output (`text`)."""

    id: str
    role: str
    kind: str  # input_audio | input_text | output_audio | output_text | function_call | function_call_output
    text: str | None = None
    audio: np.ndarray | None = None
    heard: asyncio.Future | None = None  # the transcript of an audio item, when one is being made
    name: str | None = None
    call_id: str | None = None
    arguments: str = ""

    def public(self, status: str = "completed") -> dict[str, Any]:
        if self.kind == "function_call":
            call = {"name": self.name, "call_id": self.call_id, "arguments": self.arguments}
            return {
                "id": self.id,
                "type": "function_call",
                "object": "realtime.item",
                "status": status,
                **call,
            }
        if self.kind == "function_call_output":
            result = {"call_id": self.call_id, "output": self.text or ""}
            item = {
                "id": self.id,
                "type": "function_call_output",
                "object": "realtime.item",
                "status": status,
            }
            return {**item, **result}
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
            if item.kind in ("function_call", "function_call_output"):
                _add_tool_turn(chat.messages, item)
                continue
            chat.messages.append({"role": item.role, "content": item.text or ""})
        return chat


def _add_tool_turn(messages: list[dict[str, Any]], item: Item) -> None:
    """A call joins the assistant turn before it (its text and other calls); a result is a `tool` turn."""
    if item.kind == "function_call_output":
        names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
        result = {"role": "tool", "tool_call_id": item.call_id, "content": item.text or ""}
        messages.append({**result, **({"name": names[item.call_id]} if item.call_id in names else {})})
        return
    call = {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": item.arguments},
    }
    if messages and messages[-1]["role"] == "assistant" and isinstance(messages[-1]["content"], str):
        messages[-1].setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
