"""A chat request's `tools` and `tool_choice`: what goes into the prompt, what constrains the reply, and
the reader that takes the calls out of it (serving/tool_parsers.py).

- `auto` (the default with tools): the tools are in the prompt; the model's own format is read by the
  parser its pipeline declares (`Capabilities.tool_parser`, or `omnistage serve --tool-call-parser`).
- `required` / a named function: enforced with the structured-output grammar (stages/ar/structured.py),
  as vLLM does: the reply is a JSON list of `{"name", "parameters"}` for one of the tools, or the named
  function's arguments, valid against its `parameters` schema, so even a small model returns a valid call.
- `none`: no call is read and the tools stay out of the prompt, so the model is not asked to call them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.serving.tool_parsers import NamedReader, Reader, RequiredReader, reader_for

ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclasses.dataclass
class ToolPlan:
    tools: list[dict[str, Any]] | None = None  # for the prompt
    constraint: dict[str, Any] | None = None  # SamplingParams.structured_outputs
    choice: str = "none"  # none | auto | required | named
    parser: str | None = None
    function: str | None = None
    parallel: bool = True

    @property
    def reads_calls(self) -> bool:
        return self.choice != "none"

    def reader(self) -> Reader | None:
        if self.choice == "named":
            return NamedReader(self.function or "")
        if self.choice == "required":
            return RequiredReader(self.parallel)
        if self.choice == "auto":
            return reader_for(self.parser or "hermes", self.parallel)
        return None


def plan_tools(
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    parallel: bool,
    parser: str | None,
    model_name: str,
    structured: dict[str, Any] | None = None,
) -> ToolPlan:
    """`tools` as OpenAI sends them (`{"type": "function", "function": {...}}` dicts); `tool_choice` the
    string or `{"type": "function", "function": {"name"}}`; `parser` the model's (None: it takes no tools);
    `structured` the request's own structured-output constraint, if any."""
    named = tool_choice if isinstance(tool_choice, dict) else None
    choice = "named" if named else (tool_choice or ("auto" if tools else "none"))
    if choice in ("required", "named") and not tools:
        raise InvalidRequestError(f"tool_choice: {choice!r} needs `tools`", param="tool_choice")
    if not tools or choice == "none":
        return ToolPlan()
    if parser is None:
        raise InvalidRequestError(f"tools: model {model_name!r} does not call tools", param="tools")
    functions = [tool["function"] for tool in tools]
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise InvalidRequestError("tools: two functions have the same name", param="tools")
    plan = ToolPlan(tools=tools, choice=choice, parser=parser, parallel=parallel)
    if choice == "auto":
        return plan
    if structured is not None:
        source = structured.get("source", "response_format").split(".")[0]
        raise InvalidRequestError(
            f"{source}: a structured output cannot be combined with tool_choice {choice!r} (the call's "
            "arguments are the constrained output)",
            param=source,
        )
    if choice == "named":
        name = named["function"]["name"]
        if name not in names:
            raise InvalidRequestError(
                f"tool_choice.function.name: {name!r} is not one of the tools ({', '.join(names)})",
                param="tool_choice.function.name",
            )
        index = names.index(name)
        schema = functions[index].get("parameters") or ANY_OBJECT
        plan.function = name
        plan.constraint = {"json": schema, "source": f"tools[{index}].function.parameters"}
        return plan
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [f["name"]]},
                "parameters": f.get("parameters") or ANY_OBJECT,
            },
            "required": ["name", "parameters"],
        }
        for f in functions
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    plan.constraint = {"json": schema, "source": "tools"}
    return plan


def tool_parser_of(capabilities: Any, settings: Any) -> str | None:
    """How a model's replies are read: the server's `--tool-call-parser` for a model that takes tools, else
    the format its pipeline declares (None: it takes no tools)."""
    declared = capabilities.tool_parser
    return declared and (settings.tool_call_parser or declared)


def request_tools(body: Any) -> tuple[list[dict[str, Any]] | None, Any]:
    """A pydantic chat request's tools and tool choice as plain JSON values."""
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    choice = body.tool_choice
    if choice is not None and not isinstance(choice, str):
        choice = choice.model_dump()
    return tools, choice
