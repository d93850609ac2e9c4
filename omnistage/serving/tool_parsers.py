"""Reading tool calls out of a reply's text as it streams: which parts are content, which are calls.

A reader is fed the reply's text deltas and returns `Delta`s: content to pass on, the start of a call (its
index, id and name) and pieces of a call's arguments (JSON text). One reader serves a whole reply, streamed
or not (a whole reply is one feed), so both give the same content and calls.

- `HermesReader` ("hermes"): calls in `<tool_call>` blocks, each a JSON object `{"name", "arguments"}` (or
  a list of them, as SmolLM2 writes); Qwen2.5/3's templates and omnistage/tool_prompts.py's fallback ask
  for this. Whitespace next to a call is dropped; a reply without calls is its text exactly.
- `JsonReader` ("json"): a reply that is one JSON call object (or a list), as Llama 3.1's template asks.
- `NamedReader`: a forced function (`tool_choice` naming it): the whole reply is its arguments, streamed.
- `RequiredReader`: `tool_choice: "required"`: the reply is a JSON list of `{"name", "parameters"}`.

A block that is not a valid call is passed on as content, as written.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

from omnistage.tool_prompts import CALL_CLOSE, CALL_OPEN, partial_call_open


@dataclasses.dataclass
class Delta:
    kind: str  # "content" | "call" (a call starts: index, id, name) | "arguments" (of call `index`)
    text: str = ""
    index: int = 0
    call_id: str = ""
    name: str = ""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class Reader:
    """Content passes through; subclasses find calls."""

    def __init__(self, parallel: bool = True) -> None:
        self.parallel = parallel
        self.calls = 0

    def feed(self, text: str) -> list[Delta]:
        return [Delta("content", text)] if text else []

    def finish(self) -> list[Delta]:
        return []

    def _call(self, name: str, arguments: str) -> list[Delta]:
        if self.calls and not self.parallel:
            return []  # parallel_tool_calls false: the first call only
        index, self.calls = self.calls, self.calls + 1
        return [
            Delta("call", index=index, call_id=new_call_id(), name=name),
            Delta("arguments", arguments, index),
        ]


def _calls_in(text: str, arguments_key: str = "arguments") -> list[tuple[str, str]] | None:
    """(name, arguments JSON) for each call object in `text` (an object or a list), or None if it is not
    a valid call."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    calls = [_call_of(item, arguments_key) for item in (value if isinstance(value, list) else [value])]
    return None if not calls or None in calls else calls  # type: ignore[return-value]


def _call_of(item: Any, arguments_key: str) -> tuple[str, str] | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    arguments = item.get(arguments_key, item.get("parameters", item.get("arguments", {})))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return item["name"], json.dumps(arguments, ensure_ascii=False)


class HermesReader(Reader):
    def __init__(self, parallel: bool = True) -> None:
        super().__init__(parallel)
        self.pending = ""  # text not yet passed on: a possible tag start, or an open block
        self.inside = False
        self.space = ""  # whitespace held back: dropped if a call follows, passed on if text follows
        self.after_call = False

    def feed(self, text: str) -> list[Delta]:
        self.pending += text
        out: list[Delta] = []
        while True:
            if self.inside:
                end = self.pending.find(CALL_CLOSE)
                if end < 0:
                    return out
                body, self.pending = self.pending[:end], self.pending[end + len(CALL_CLOSE) :]
                self.inside = False
                out += self._block(body, closed=True)
                continue
            start = self.pending.find(CALL_OPEN)
            if start < 0:
                held = partial_call_open(self.pending)
                out += self._content(self.pending[: len(self.pending) - held])
                self.pending = self.pending[len(self.pending) - held :]
                return out
            out += self._content(self.pending[:start])
            self.pending = self.pending[start + len(CALL_OPEN) :]
            self.inside = True

    def finish(self) -> list[Delta]:
        if self.inside:
            out = self._block(self.pending, closed=False)
        else:
            out = self._content(self.pending)
        self.pending = ""
        if self.space and not self.calls:
            out.append(Delta("content", self.space))
        return out

    def _block(self, body: str, closed: bool) -> list[Delta]:
        calls = _calls_in(body.strip())
        if calls is None:
            return self._content(CALL_OPEN + body + (CALL_CLOSE if closed else ""))
        self.space = ""
        out = [d for name, arguments in calls for d in self._call(name, arguments)]
        self.after_call = True
        return out

    def _content(self, text: str) -> list[Delta]:
        text = self.space + text
        if self.after_call:
            text = text.lstrip()
        body = text.rstrip()
        self.space = text[len(body) :]
        if not body:
            return []
        self.after_call = False
        return [Delta("content", body)]


class JsonReader(Reader):
    """A reply that starts with `{` or `[` is held to the end and read as calls; any other streams."""

    def __init__(self, parallel: bool = True) -> None:
        super().__init__(parallel)
        self.text = ""
        self.passing = False

    def feed(self, text: str) -> list[Delta]:
        if self.passing:
            return super().feed(text)
        self.text += text
        start = self.text.lstrip()
        if start and start[0] not in "{[":
            self.passing, text, self.text = True, self.text, ""
            return super().feed(text)
        return []

    def finish(self) -> list[Delta]:
        if self.passing or not self.text:
            return []
        calls = _calls_in(self.text.strip())
        if calls is None:
            return [Delta("content", self.text)]
        return [d for name, arguments in calls for d in self._call(name, arguments)]


class NamedReader(Reader):
    """The forced function's arguments, streamed as they come (the grammar keeps them valid JSON)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def feed(self, text: str) -> list[Delta]:
        out = []
        if not self.calls:
            text = text.lstrip()
            if not text:
                return []
            self.calls = 1
            out.append(Delta("call", index=0, call_id=new_call_id(), name=self.name))
        return out + [Delta("arguments", text, 0)] if text else out

    def finish(self) -> list[Delta]:
        return [] if self.calls else self.feed("{}")


class RequiredReader(Reader):
    """`[{"name": ..., "parameters": {...}}, ...]`: each call as soon as its object closes (the grammar
    keeps the list valid; one cut short by max_tokens keeps the calls it completed)."""

    def __init__(self, parallel: bool = True) -> None:
        super().__init__(parallel)
        self.text = ""
        self.position = 0  # where the next call object may start; -1: not a list
        self.decoder = json.JSONDecoder()

    def feed(self, text: str) -> list[Delta]:
        self.text += text
        out: list[Delta] = []
        if not self.position:
            start = self.text.lstrip()
            if not start:
                return out
            self.position = len(self.text) - len(start) + 1 if start[0] == "[" else -1
        while self.position > 0:
            rest = self.text[self.position :]
            item = rest.lstrip(" \t\r\n,")
            self.position += len(rest) - len(item)
            if not item.startswith("{"):
                break
            try:
                value, self.position = self.decoder.raw_decode(self.text, self.position)
            except json.JSONDecodeError:
                break  # not closed yet
            call = _call_of(value, "parameters")
            if call is not None:
                out += self._call(*call)
        return out

    def finish(self) -> list[Delta]:
        if self.calls or not self.text:
            return []
        return [Delta("content", self.text)]  # not a list of calls: what there is, as content


def reader_for(parser: str, parallel: bool) -> Reader:
    return {"hermes": HermesReader, "json": JsonReader}[parser](parallel)


def read_whole(reader: Reader, text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content or None, OpenAI `tool_calls` entries) of a whole reply."""
    content, calls = "", []
    for delta in [*reader.feed(text), *reader.finish()]:
        if delta.kind == "content":
            content += delta.text
        elif delta.kind == "call":
            call = {"name": delta.name, "arguments": ""}
            calls.append({"id": delta.call_id, "type": "function", "function": call})
        else:
            calls[delta.index]["function"]["arguments"] += delta.text
    return content or None, calls
