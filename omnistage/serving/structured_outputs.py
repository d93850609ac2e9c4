"""A chat or completions request's structured-output constraint, from whichever name the client used:
OpenAI's `response_format` (`json_object`, `json_schema`), vLLM's `structured_outputs` ({json, regex,
choice, grammar, json_object}) or its older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar`. One constraint a request; the AR stage compiles and applies it (stages/ar/structured.py)
and refuses one xgrammar cannot compile, naming the field it came from."""

from __future__ import annotations

from typing import Any

from omnistage.errors import InvalidRequestError

KINDS = ("json", "json_object", "regex", "choice", "grammar")
GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def structured_outputs_of(body: Any) -> dict[str, Any] | None:
    """`SamplingParams.structured_outputs` fields for the request, or None (no constraint)."""
    found: list[dict[str, Any]] = []
    response_format = getattr(body, "response_format", None)
    if response_format is not None and response_format.type == "json_object":
        found.append({"json_object": True, "source": "response_format"})
    elif response_format is not None and response_format.type == "json_schema":
        schema = response_format.json_schema.schema_ if response_format.json_schema else None
        if schema is None:
            raise InvalidRequestError(
                "response_format.json_schema.schema: required for type json_schema",
                param="response_format.json_schema.schema",
            )
        found.append({"json": schema, "source": "response_format.json_schema.schema"})
    given = getattr(body, "structured_outputs", None)
    if given:
        unknown = sorted(set(given) - set(KINDS))
        if unknown:
            raise InvalidRequestError(
                f"structured_outputs.{unknown[0]}: unknown (known: {', '.join(KINDS)})",
                param=f"structured_outputs.{unknown[0]}",
            )
        found.append({**given, "source": "structured_outputs"})
    for name, kind in GUIDED.items():
        value = getattr(body, name, None)
        if value is not None:
            found.append({kind: value, "source": name})
    if len(found) > 1:
        second = found[1]["source"].split(".")[0]
        raise InvalidRequestError(
            f"{second}: a request takes one structured-output constraint (it also has "
            f"{found[0]['source'].split('.')[0]})",
            param=second,
        )
    return found[0] if found else None
