"""Structured outputs on chat and completions (a tiny random-weight Qwen2 on the AR engine, served in
process): whatever the model would say, the answer keeps to the constraint — a strict JSON schema parses
and holds its types, any JSON object parses, a regex matches in full, a choice is one of its options, an
EBNF grammar's language — named the OpenAI way (`response_format`), vLLM's (`structured_outputs`) or its
older `guided_*`; streamed and sampled too; requests with different constraints (or none) batched
together each keep to their own; a constraint xgrammar cannot compile, or two at once, is a 400 naming the
field."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import openai
import pytest
from openai import OpenAI

from omnistage.families.llm.tiny import tiny_llm_dir
from tests.support.in_process import served

pytestmark = pytest.mark.engine

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z ]{1,12}$"},  # (a random model writes any bytes)
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    yield from served(tiny_llm_dir("qwen2"), "tiny", tmp_path_factory.mktemp("structured"))


@pytest.fixture(scope="module")
def client(app) -> OpenAI:
    return OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=app, max_retries=0)


def chat(client: OpenAI, **fields) -> str:
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=96, **fields)
    assert reply.choices[0].finish_reason == "stop", reply
    return reply.choices[0].message.content


def holds_person(text: str) -> None:
    value = json.loads(text)
    assert set(value) == {"name", "age", "tags"} and isinstance(value["name"], str)
    assert isinstance(value["age"], int) and len(value["name"]) <= 12
    assert all(t in ("a", "b") for t in value["tags"]) and len(value["tags"]) <= 2


def test_a_json_schema_holds_greedy_and_sampled(client: OpenAI) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    holds_person(chat(client, response_format=schema, temperature=0))
    for seed in (1, 2, 3):
        holds_person(chat(client, response_format=schema, temperature=1.0, seed=seed))
    anything = json.loads(chat(client, response_format={"type": "json_object"}, seed=25))
    assert isinstance(anything, dict) and anything


def test_regex_choice_and_grammar_by_any_name(client: OpenAI) -> None:
    text = chat(client, extra_body={"structured_outputs": {"regex": r"[A-Z][a-z]{2,6} \d{2}"}}, seed=5)
    assert re.fullmatch(r"[A-Z][a-z]{2,6} \d{2}", text), text
    assert chat(client, extra_body={"guided_choice": ["yes", "no", "maybe"]}, seed=6) in (
        "yes",
        "no",
        "maybe",
    )
    grammar = 'root ::= "(" digit+ ("+" digit+)* ")"\ndigit ::= [0-9]'
    text = chat(client, extra_body={"guided_grammar": grammar}, seed=7)
    assert re.fullmatch(r"\(\d+(\+\d+)*\)", text), text
    completion = client.completions.create(
        model="tiny", prompt="Pick:", max_tokens=16, extra_body={"guided_regex": "(cat|dog)s?"}
    )
    assert re.fullmatch("(cat|dog)s?", completion.choices[0].text)


def test_streamed_and_batched_with_others(app, client: OpenAI) -> None:
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=96, response_format=schema, stream=True, seed=8
    )
    holds_person("".join(c.choices[0].delta.content or "" for c in stream if c.choices))

    async def together() -> list[dict]:
        bodies = [
            {"response_format": schema, "seed": 9},
            {"structured_outputs": {"regex": "[0-9]{4}"}, "seed": 10},
            {"seed": 11, "max_tokens": 8},
            {"guided_choice": ["left", "right"], "seed": 12},
        ]
        transport = httpx.ASGITransport(app=app.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            replies = await asyncio.gather(
                *(
                    http.post(
                        "/v1/chat/completions",
                        json={"model": "tiny", "messages": MESSAGES, "max_tokens": 96, **b},
                        timeout=120,
                    )
                    for b in bodies
                )
            )
        return [r.json()["choices"][0]["message"]["content"] for r in replies]

    person, digits, free, side = asyncio.run(together())
    holds_person(person)
    assert re.fullmatch("[0-9]{4}", digits) and side in ("left", "right") and isinstance(free, str)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "frobnicate"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"extra_body": {"guided_regex": "(unclosed"}}, "guided_regex"),
        ({"extra_body": {"structured_outputs": {"grammar": "root ::= missing_rule"}}}, "structured_outputs"),
        ({"extra_body": {"structured_outputs": {"regex": "a", "choice": ["b"]}}}, "structured_outputs"),
        ({"extra_body": {"structured_outputs": {"xml": "<a/>"}}}, "structured_outputs.xml"),
        (
            {"response_format": {"type": "json_object"}, "extra_body": {"guided_choice": ["a"]}},
            "guided_choice",
        ),
    ],
)
def test_constraints_that_cannot_hold_are_400(client: OpenAI, fields: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, **fields)
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == param, refused.value.body


CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
    },
    "required": ["city", "country", "population"],
    "additionalProperties": False,
}
CITIES = ["Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Nairobi", "Toronto", "Hanoi", "Madrid", "Perth"]


@pytest.fixture(scope="module")
def demo_app(demo_chat_app):
    """The demo chat model (SmolLM2-135M-Instruct, trained weights), served in process (tests/serving)."""
    return demo_chat_app


def holds_city(text: str) -> dict:
    value = json.loads(text)
    assert set(value) == {"city", "country", "population"}, value
    assert isinstance(value["city"], str) and len(value["city"]) <= 40
    assert isinstance(value["country"], str) and len(value["country"]) <= 40
    assert isinstance(value["population"], int) and 0 <= value["population"] <= 100000000
    return value


def test_the_demo_model_answers_ten_prompts_in_the_schema_streamed_and_not(demo_app) -> None:
    """Through the official client (its async form, all prompts at once): each answer is JSON in the
    schema, and a JSON object when any object is asked for."""
    schema = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}

    async def ask(client: openai.AsyncOpenAI, content: str, stream: bool, **fields) -> str:
        fields = {"response_format": schema, "max_tokens": 80, **fields}
        messages = [{"role": "user", "content": content}]
        reply = await client.chat.completions.create(
            model="smollm2", messages=messages, temperature=0, stream=stream, **fields
        )
        if not stream:
            assert reply.choices[0].finish_reason == "stop"
            return reply.choices[0].message.content
        return "".join([c.choices[0].delta.content or "" async for c in reply if c.choices])

    async def everything() -> tuple[list[str], list[str], str]:
        transport = httpx.ASGITransport(app=demo_app.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=300) as http:
            client = openai.AsyncOpenAI(
                base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=0
            )
            questions = [f"Give the city {c}, its country and population as JSON." for c in CITIES]
            return await asyncio.gather(
                asyncio.gather(*(ask(client, q, False) for q in questions)),
                asyncio.gather(*(ask(client, q, True) for q in questions)),
                ask(
                    client,
                    "Return a JSON object with the keys name and age for Ana, 31.",
                    False,
                    response_format={"type": "json_object"},
                    max_tokens=120,
                ),
            )

    answers, streamed, anything = asyncio.run(everything())
    records = [holds_city(a) for a in answers]
    assert len({r["city"] for r in records}) >= 5  # it answers each prompt, not one record for all
    for text in streamed:
        holds_city(text)
    assert json.loads(anything) == {"name": "Ana", "age": 31}
