"""Tool calling on chat, through the official `openai` client (models served in process, stages inline).

- A tiny random-weight Qwen2 with a Qwen2.5-style tool template: a Hermes-format reply (held to a fixed
  text by a regex constraint, so a random model writes it) is read into exactly its calls, whole and
  streamed; `required` and a named function return calls whose arguments hold to the schema, greedy and
  sampled; bad tool fields are a 400 naming them.
- The demo's chat model (SmolLM2-135M-Instruct, trained weights, a template without tools): a named
  function's arguments validate; `none` never calls; a tool result sent back is answered from.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator

import jsonschema
import openai
import pytest
from openai import OpenAI

from omnistage.families.llm.tiny import tiny_llm_dir
from tests.support.in_process import served

pytestmark = pytest.mark.engine

# The Qwen2.5 chat format for tools (its template lives on the model hub): tools in the system turn,
# calls in <tool_call> blocks, results as user turns in <tool_response> blocks.
QWEN_TOOLS_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> \
XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{% if message.content %}{{ message.content }}
{% endif %}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% if not loop.last %}
{% endif %}{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"},  # a random model writes any bytes
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "pattern": "^[A-Za-z ]{1,20}$"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
HERMES_REPLY = (
    "Checking both.\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
    '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Paris"}}\n</tool_call>'
)
HERMES_CALLS = [("get_weather", '{"city": "Paris", "unit": "celsius"}'), ("get_time", '{"city": "Paris"}')]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Iterator[OpenAI]:
    model_dir = tmp_path_factory.mktemp("qwen-tools") / "model"
    shutil.copytree(tiny_llm_dir("qwen2"), model_dir)
    (model_dir / "chat_template.jinja").write_text(QWEN_TOOLS_TEMPLATE)
    config = json.loads((model_dir / "config.json").read_text())  # the tools take ~800 of its small tokens
    (model_dir / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    for app in served(model_dir, "tiny", tmp_path_factory.mktemp("qwen-tools-storage")):
        yield OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=app, max_retries=0)


def literal(text: str) -> str:
    """A regex matching exactly `text` (only the metacharacters escaped: xgrammar warns on the rest)."""
    return re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", text)


def streamed(client: OpenAI, **fields) -> tuple[str, list[tuple[str, str]], str, list]:
    """(content, calls, finish reason, each call's first delta) of a streamed reply, as a client joins it."""
    content, calls, firsts, finish = "", [], [], None
    for chunk in client.chat.completions.create(stream=True, **fields):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or ():
            if call.id is not None:
                assert call.index == len(calls) and call.type == "function"
                firsts.append(call)
                calls.append([call.function.name, call.function.arguments])
            else:
                assert call.function.name is None
                calls[call.index][1] += call.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    return content, [tuple(c) for c in calls], finish, firsts


def test_a_hermes_reply_is_read_into_its_calls_whole_and_streamed(qwen: OpenAI) -> None:
    fields = dict(
        model="tiny",
        messages=ASK,
        tools=[WEATHER, TIME],
        max_tokens=400,
        extra_body={"structured_outputs": {"regex": literal(HERMES_REPLY)}},
    )
    reply = qwen.chat.completions.create(**fields).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content == "Checking both."
    calls = [(c.function.name, c.function.arguments) for c in reply.message.tool_calls]
    assert calls == HERMES_CALLS
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in reply.message.tool_calls)
    content, calls, finish, firsts = streamed(qwen, **fields)
    assert (content, calls, finish) == ("Checking both.", HERMES_CALLS, "tool_calls")
    assert all(f.function.arguments == "" for f in firsts)  # the first delta names the call
    only_first = qwen.chat.completions.create(**fields, parallel_tool_calls=False).choices[0]
    assert [c.function.name for c in only_first.message.tool_calls] == ["get_weather"]


def test_the_tools_are_in_the_prompt_through_the_models_template(qwen: OpenAI) -> None:
    plain = qwen.chat.completions.create(model="tiny", messages=ASK, max_tokens=1)
    tooled = qwen.chat.completions.create(model="tiny", messages=ASK, max_tokens=1, tools=[WEATHER])
    unused = qwen.chat.completions.create(
        model="tiny", messages=ASK, max_tokens=1, tools=[WEATHER], tool_choice="none"
    )
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 40
    assert unused.usage.prompt_tokens == plain.usage.prompt_tokens  # `none`: the tools stay out


@pytest.mark.parametrize("stream", [False, True])
def test_required_and_named_calls_hold_to_the_schemas(qwen: OpenAI, stream: bool) -> None:
    for seed in (None, 1, 2):
        sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        for choice in ("required", NAMED):
            fields = dict(
                model="tiny", messages=ASK, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=200
            )
            if stream:
                content, calls, finish, _ = streamed(qwen, **fields, **sampling)
            else:
                reply = qwen.chat.completions.create(**fields, **sampling).choices[0]
                content, finish = reply.message.content, reply.finish_reason
                calls = [(c.function.name, c.function.arguments) for c in reply.message.tool_calls or ()]
            assert finish in ("tool_calls", "length") and not content and calls
            if choice == NAMED:
                assert [name for name, _ in calls] == ["get_weather"]
            for name, arguments in calls:
                jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        (
            {"messages": [*ASK, {"role": "tool", "content": "sunny"}]},
            "messages[1].tool_call_id",
        ),
    ],
)
def test_bad_tool_fields_are_400_naming_them(qwen: OpenAI, fields: dict, param: str) -> None:
    request = {"model": "tiny", "messages": ASK, "tools": [WEATHER], "max_tokens": 4, **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        qwen.chat.completions.create(**{k: v for k, v in request.items() if v is not None})
    assert refused.value.status_code == 400 and refused.value.body["param"] == param


# ---- the demo's chat model ----------------------------------------------------------------------------
DEMO_PROMPTS = ["Is it cold in Oslo right now? Tell me in fahrenheit."]  # (and the next test's Paris)


@pytest.fixture(scope="module")
def demo(demo_chat_app) -> OpenAI:
    return OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=demo_chat_app, max_retries=0)


def test_the_demo_model_calls_a_named_function_with_valid_arguments(demo: OpenAI) -> None:
    for text in DEMO_PROMPTS:
        fields = dict(model="smollm2", messages=[{"role": "user", "content": text}], tools=[WEATHER, TIME])
        reply = demo.chat.completions.create(**fields, tool_choice=NAMED, temperature=0).choices[0]
        assert reply.finish_reason == "tool_calls" and len(reply.message.tool_calls) == 1
        call = reply.message.tool_calls[0]
        assert call.function.name == "get_weather"
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS["get_weather"])
        content, calls, finish, _ = streamed(demo, **fields, tool_choice=NAMED, temperature=0)
        assert (content, calls, finish) == ("", [("get_weather", call.function.arguments)], "tool_calls")
        never = demo.chat.completions.create(**fields, tool_choice="none", temperature=0, max_tokens=8)
        assert never.choices[0].message.tool_calls is None and never.choices[0].finish_reason != "tool_calls"


def test_a_tool_result_continues_the_conversation(demo: OpenAI) -> None:
    first = demo.chat.completions.create(
        model="smollm2", messages=ASK, tools=[WEATHER], tool_choice=NAMED, temperature=0
    ).choices[0]
    call = first.message.tool_calls[0]
    result = {"temperature": 21, "unit": "celsius", "sky": "sunny"}
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
    ]
    answer = demo.chat.completions.create(
        model="smollm2", messages=history, tools=[WEATHER], temperature=0, max_tokens=60
    ).choices[0]
    assert answer.finish_reason == "stop" and answer.message.tool_calls is None
    assert "21" in answer.message.content and "sunny" in answer.message.content  # read from the result
