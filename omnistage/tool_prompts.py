"""Tools in a chat prompt: rendering a conversation with tool definitions, calls and results through the
model's chat template, and the tool-call blocks a reply may hold.

A template that renders `tools` itself (Qwen2.5/3, Llama 3.1, Hermes, Mistral, ...) gets them as
transformers passes them, with call arguments as objects. A template that ignores them (SmolLM2's, the
plain ChatML of small models) would drop them silently; for those the tools go into the system message and
calls and results into the messages' text, in the Hermes format (`<tool_call>` blocks holding
`{"name": ..., "arguments": {...}}`, results in `<tool_response>` blocks): the format the "hermes" parser
reads back (serving/tool_parsers.py) and the one SmolLM2 was trained to call functions with.

Shared by the AR stage (the prompt it encodes), the server (counting a prompt's tokens) and speech stages
that speak an LLM's reply (which never say a tool call aloud: `speakable`).
"""

from __future__ import annotations

import json
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_PROBE_NAME = "omnistage_probe_function"
_PROBE_TOOLS = [{"type": "function", "function": {"name": _PROBE_NAME, "parameters": {"type": "object"}}}]
_renders_tools: dict[str, bool] = {}  # chat template -> whether it writes the tools it is given

TOOLS_SYSTEM_TEXT = (
    "You can call functions to help answer. The functions, as JSON schemas:\n<tools>\n{tools}\n</tools>\n"
    "To call one or more of them, answer with one block per call, each a JSON object with the function's "
    'name and its arguments:\n<tool_call>\n{{"name": "<function name>", "arguments": {{<arguments>}}}}\n'
    "</tool_call>"
)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kw):
    """`tokenizer.apply_chat_template(messages, tools=...)` for any template (see the module's doc)."""
    has_tool_turns = any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)
    if not tools and not has_tool_turns:
        return tokenizer.apply_chat_template(messages, **kw)
    if renders_tools(tokenizer):
        return tokenizer.apply_chat_template(_for_template(messages), tools=tools or None, **kw)
    try:
        return tokenizer.apply_chat_template(tools_in_text(messages, tools), **kw)
    except Exception:  # noqa: BLE001 - a template that knows only system/user/assistant turns
        return tokenizer.apply_chat_template(tools_in_text(messages, tools, results_role="user"), **kw)


def renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template writes the tools it is given (probed once per template)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return False
    if template not in _renders_tools:
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": "hi"}], tools=_PROBE_TOOLS, tokenize=False
            )
            _renders_tools[template] = _PROBE_NAME in text
        except Exception:  # noqa: BLE001 - a template that fails on tools does not take them
            _renders_tools[template] = False
    return _renders_tools[template]


def _arguments_object(arguments: Any) -> Any:
    """A call's arguments as the JSON object HF templates expect (OpenAI sends them as a JSON string)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def _for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            calls = [
                {
                    **call,
                    "function": {
                        **call["function"],
                        "arguments": _arguments_object(call["function"]["arguments"]),
                    },
                }
                for call in calls
            ]
            message = {**message, "tool_calls": calls}
        out.append(message)
    return out


def call_block(name: str, arguments: Any) -> str:
    body = json.dumps({"name": name, "arguments": _arguments_object(arguments)}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def tools_in_text(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, results_role: str = "tool"
) -> list[dict[str, Any]]:
    """The conversation with tools, calls and results written as text, for a template that has no tools.
    Results keep the `tool` role (a ChatML template writes any role; SmolLM2 answers from them there,
    where as a user's turn it repeats them), or `results_role` for a template that refuses it."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if message.get("tool_calls"):
            calls = message["tool_calls"]
            blocks = [call_block(c["function"]["name"], c["function"]["arguments"]) for c in calls]
            text = content if isinstance(content, str) else ""
            out.append({"role": "assistant", "content": "\n".join(([text] if text else []) + blocks)})
        elif role == "tool":
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
            out.append({"role": results_role, "content": f"<tool_response>\n{text}\n</tool_response>"})
        else:
            out.append({"role": role, "content": content})
    if tools:
        listed = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
        system = TOOLS_SYSTEM_TEXT.format(tools=listed)
        if out and out[0]["role"] == "system" and isinstance(out[0]["content"], str):
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + system}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def speakable(text: str, final: bool) -> tuple[str, str]:
    """(the part of a streamed reply that may be spoken, the part held back): closed tool-call blocks are
    removed, and the text from an unclosed block (or from what may be the start of one) is held until it
    closes; at the end (`final`) an unclosed block is dropped."""
    spoken = []
    while True:
        start = text.find(CALL_OPEN)
        if start < 0:
            break
        end = text.find(CALL_CLOSE, start)
        if end < 0:
            return "".join(spoken) + text[:start], "" if final else text[start:]
        spoken.append(text[:start])
        text = text[end + len(CALL_CLOSE) :]
    held = 0 if final else partial_call_open(text)
    return "".join(spoken) + text[: len(text) - held], text[len(text) - held :]


def partial_call_open(text: str) -> int:
    """How many characters at the end of `text` could begin a `<tool_call>` tag."""
    for size in range(min(len(CALL_OPEN) - 1, len(text)), 0, -1):
        if CALL_OPEN.startswith(text[-size:]):
            return size
    return 0
