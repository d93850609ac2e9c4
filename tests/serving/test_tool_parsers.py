"""Tool-call readers and tool prompts on their own: a reply read whole and fed a character at a time give
the same content and calls; Hermes blocks (an object or a list), bare JSON calls, a forced function's
arguments and `required`'s list; what is not a call stays content, as written; templates with and without
tools of their own get the tools, calls and results."""

from __future__ import annotations

import json

import pytest

from omnistage.errors import InvalidRequestError
from omnistage.serving.tool_calls import plan_tools
from omnistage.serving.tool_parsers import (
    HermesReader,
    JsonReader,
    NamedReader,
    Reader,
    RequiredReader,
    read_whole,
)
from omnistage.tool_prompts import render_chat, speakable

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo", "utc": true}}\n</tool_call>'
WEATHER = ("get_weather", '{"city": "Paris"}')
TIME = ("get_time", '{"city": "Oslo", "utc": true}')


def fed_by_character(reader: Reader, text: str) -> tuple[str | None, list[tuple[str, str]]]:
    content, calls = "", []
    for delta in [d for ch in text for d in reader.feed(ch)] + reader.finish():
        if delta.kind == "content":
            content += delta.text
        elif delta.kind == "call":
            assert delta.call_id.startswith("call_") and delta.index == len(calls)
            calls.append([delta.name, ""])
        else:
            calls[delta.index][1] += delta.text
    return content or None, [tuple(c) for c in calls]


def whole(reader: Reader, text: str) -> tuple[str | None, list[tuple[str, str]]]:
    content, calls = read_whole(reader, text)
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    return content, [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


CASES = [
    ("plain answer, kept exactly ", HermesReader, "plain answer, kept exactly ", []),
    ("  leading and trailing space \n", HermesReader, "  leading and trailing space \n", []),
    (WEATHER_CALL, HermesReader, None, [WEATHER]),
    (f"Let me look.\n{WEATHER_CALL}\n{TIME_CALL}\n", HermesReader, "Let me look.", [WEATHER, TIME]),
    (  # SmolLM2's form: a list in one block
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_time", "arguments": "{\\"city\\": \\"Oslo\\", \\"utc\\": true}"}]</tool_call>',
        HermesReader,
        None,
        [WEATHER, TIME],
    ),
    ("a < b and <tool maybe", HermesReader, "a < b and <tool maybe", []),
    ("<tool_call>not json</tool_call> after", HermesReader, "<tool_call>not json</tool_call> after", []),
    (WEATHER_CALL[: -len("</tool_call>")], HermesReader, None, [WEATHER]),  # EOS before the close
    ('{"name": "get_weather", "parameters": {"city": "Paris"}}', JsonReader, None, [WEATHER]),
    ("It is sunny.", JsonReader, "It is sunny.", []),
    ("{not a call", JsonReader, "{not a call", []),
    ('{"city": "Paris"}', lambda: NamedReader("get_weather"), None, [WEATHER]),
    (
        '[{"name": "get_weather", "parameters": {"city": "Paris"}},\n'
        ' {"name": "get_time", "parameters": {"city": "Oslo", "utc": true}}]',
        RequiredReader,
        None,
        [WEATHER, TIME],
    ),
    # cut short by max_tokens: the calls that closed
    (
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_ti',
        RequiredReader,
        None,
        [WEATHER],
    ),
]


@pytest.mark.parametrize(("text", "reader", "content", "calls"), CASES)
def test_whole_and_streamed_replies_read_the_same(text, reader, content, calls) -> None:
    assert whole(reader(), text) == (content, calls)
    assert fed_by_character(reader(), text) == (content, calls)


def test_one_call_only_when_parallel_calls_are_off() -> None:
    text = f"{WEATHER_CALL}\n{TIME_CALL}"
    assert whole(HermesReader(parallel=False), text) == (None, [WEATHER])


def test_speech_never_says_a_call() -> None:
    spoken, held = speakable(f"Sure. {WEATHER_CALL} Done <tool", final=False)
    assert (spoken, held) == ("Sure.  Done ", "<tool")
    assert speakable('Sure. <tool_call>{"name"', final=False) == ("Sure. ", '<tool_call>{"name"')
    assert speakable('Sure. <tool_call>{"name"', final=True) == ("Sure. ", "")


FUNCTIONS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"sky": "sunny"}'},
]


class TemplateTokenizer:
    """Renders like transformers does (its own jinja renderer), with a given template."""

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def apply_chat_template(self, messages, tools=None, **kw):
        from transformers.utils.chat_template_utils import render_jinja_template

        kw.pop("tokenize", None)
        rendered, _ = render_jinja_template(
            conversations=[messages], tools=tools, chat_template=self.chat_template, **kw
        )
        return rendered[0]


CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
WITH_TOOLS = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}"
    "{% for m in messages %}{{ m.role }}:{% if m.tool_calls %}{% for c in m.tool_calls %}"
    "{{ c.function.name }}({{ c.function.arguments.city }}){% endfor %}{% else %}{{ m.content }}{% endif %}|"
    "{% endfor %}"
)


def test_a_template_without_tools_gets_them_in_hermes_form() -> None:
    text = render_chat(TemplateTokenizer(CHATML), CONVERSATION, FUNCTIONS, add_generation_prompt=True)
    system, user, assistant, tool = text.split("<|im_start|>")[1:5]
    assert system.startswith("system\n") and json.dumps(FUNCTIONS[0]["function"]) in system
    assert user == "user\nWeather in Paris?<|im_end|>\n"
    assert assistant == f"assistant\n{WEATHER_CALL}<|im_end|>\n"
    assert tool == 'tool\n<tool_response>\n{"sky": "sunny"}\n</tool_response><|im_end|>\n'


def test_a_template_with_tools_renders_them_itself_with_arguments_as_objects() -> None:
    text = render_chat(TemplateTokenizer(WITH_TOOLS), CONVERSATION, FUNCTIONS)
    assert (
        text == 'TOOLS:get_weather;user:Weather in Paris?|assistant:get_weather(Paris)|tool:{"sky": "sunny"}|'
    )
    plain = [{"role": "user", "content": "hi"}]
    assert render_chat(TemplateTokenizer(CHATML), plain, None) == "<|im_start|>user\nhi<|im_end|>\n"


def test_tool_choice_rules() -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    plan = plan_tools(FUNCTIONS, named, True, "hermes", "m")
    assert plan.constraint == {
        "json": FUNCTIONS[0]["function"]["parameters"],
        "source": "tools[0].function.parameters",
    }
    assert plan_tools(FUNCTIONS, "none", True, "hermes", "m").tools is None  # not even in the prompt
    assert plan_tools(FUNCTIONS, None, True, "hermes", "m").choice == "auto"
    refused = [
        ((FUNCTIONS, "auto", True, None, "m"), "tools"),
        ((None, "required", True, "hermes", "m"), "tool_choice"),
        (
            (FUNCTIONS, {"type": "function", "function": {"name": "nope"}}, True, "hermes", "m"),
            "tool_choice.function.name",
        ),
        ((FUNCTIONS + FUNCTIONS, "auto", True, "hermes", "m"), "tools"),
    ]
    for args, param in refused:
        with pytest.raises(InvalidRequestError) as refusal:
            plan_tools(*args)
        assert refusal.value.param == param
    with pytest.raises(InvalidRequestError) as refusal:
        plan_tools(
            FUNCTIONS, "required", True, "hermes", "m", {"json_object": True, "source": "response_format"}
        )
    assert refusal.value.param == "response_format"
