"""Function calling in a realtime session (the demo's voice loop, the official `openai` client): the
session takes `tools`; a response that calls one sends the function-call item and its argument events (no
audio: a call is never spoken); the client's `function_call_output` item continues the conversation and the
next response answers from it, spoken; bad tool settings are `error` events naming the field."""

from __future__ import annotations

import base64
import json

import jsonschema
import numpy as np
import pytest
from openai import OpenAI

from tests.realtime.conftest import CHAT, OMNI, WHISPER, recv_until, wav_bytes
from tests.speech.stages import wait_idle
from tests.support.asr import wer

pytestmark = pytest.mark.e2e
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
RESULT = {"temperature": 21, "unit": "celsius", "sky": "sunny"}


def user_text(conn, text: str) -> None:
    conn.conversation.item.create(
        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )
    recv_until(conn, "conversation.item.done")


def test_a_call_is_made_answered_and_the_answer_spoken(realtime_client: OpenAI, http) -> None:
    called, answered = [], []
    with realtime_client.realtime.connect(model=CHAT) as conn:
        session = {
            "type": "realtime",
            "temperature": 0.0,
            "audio": {"input": {"turn_detection": None}},
            "tools": [WEATHER],
            "tool_choice": "auto",
        }
        conn.session.update(session=session)
        updated = recv_until(conn, "session.updated")
        assert [t.name for t in updated.session.tools] == ["get_weather"]
        user_text(conn, "What is the weather like in Paris today?")
        conn.response.create(response={"tool_choice": {"type": "function", "name": "get_weather"}})
        done = recv_until(conn, "response.done", called)
        assert done.response.status == "completed"
        [call] = done.response.output
        assert call.type == "function_call" and call.name == "get_weather" and call.call_id
        jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
        added = next(e for e in called if e.type == "response.output_item.added")
        assert added.item.type == "function_call" and added.item.arguments == ""
        deltas = [e for e in called if e.type == "response.function_call_arguments.delta"]
        assert "".join(e.delta for e in deltas) == call.arguments and deltas[0].call_id == call.call_id
        finished = next(e for e in called if e.type == "response.function_call_arguments.done")
        assert (finished.name, finished.arguments, finished.item_id) == (call.name, call.arguments, call.id)
        assert not [e for e in called if e.type.startswith("response.output_audio")]  # a call is not said

        conn.conversation.item.create(
            item={"type": "function_call_output", "call_id": call.call_id, "output": json.dumps(RESULT)}
        )
        created = recv_until(conn, "conversation.item.done")
        assert created.item.type == "function_call_output" and created.item.call_id == call.call_id
        conn.response.create()
        done = recv_until(conn, "response.done", answered)
    assert done.response.status == "completed"
    [message] = done.response.output
    transcript = message.content[0].transcript
    assert "21" in transcript and "sunny" in transcript  # answered from the call's output
    assert not [e for e in answered if e.type.startswith("response.function_call")]
    pcm = b"".join(base64.b64decode(e.delta) for e in answered if e.type == "response.output_audio.delta")
    spoken = np.frombuffer(pcm, "<i2")
    heard = realtime_client.audio.transcriptions.create(model=WHISPER, file=("a.wav", wav_bytes(spoken))).text
    assert wer(transcript, heard) <= 0.3
    wait_idle(http, CHAT)


def test_bad_tool_settings_are_errors_naming_them(realtime_client: OpenAI) -> None:
    with realtime_client.realtime.connect(model=CHAT) as conn:
        conn.session.update(
            session={
                "type": "realtime",
                "tools": [WEATHER],
                "tool_choice": {"type": "function", "name": "nope"},
            }
        )
        error = recv_until(conn, "error").error
        assert error.param == "session.tool_choice" and "nope" in error.message
        conn.session.update(session={"type": "realtime", "tools": [{**WEATHER, "name": "bad name!"}]})
        assert recv_until(conn, "error").error.param == "session.tools[0].name"
        conn.conversation.item.create(item={"type": "function_call_output", "output": "{}"})
        assert recv_until(conn, "error").error.param == "item.call_id"
    with realtime_client.realtime.connect(model=OMNI) as conn:  # its pipeline reads no tool calls
        conn.session.update(session={"type": "realtime", "tools": [WEATHER]})
        error = recv_until(conn, "error").error
        assert error.param == "session.tools" and "does not call tools" in error.message


def test_a_spoken_chat_reply_says_its_text_and_never_its_call(realtime_client: OpenAI, http) -> None:
    """Chat with text and audio out, the reply held (by a regex) to a sentence and then a Hermes call: the
    call comes back as `tool_calls`, and the audio says the sentence only."""
    sentence = "Let me check the weather for you."
    arguments = '{"city": "Paris", "unit": "celsius"}'
    call = f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'
    pattern = (sentence + "\n" + call).replace(".", r"\.").replace("{", r"\{").replace("}", r"\}")
    reply = realtime_client.chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "What is the weather like in Paris today?"}],
        modalities=["text", "audio"],
        tools=[{"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}],
        extra_body={"structured_outputs": {"regex": pattern}},
        max_tokens=80,
    ).choices[0]
    assert reply.finish_reason == "tool_calls" and reply.message.content == sentence
    assert reply.message.audio.transcript == sentence
    [made] = reply.message.tool_calls
    assert (made.function.name, json.loads(made.function.arguments)) == (
        "get_weather",
        {"city": "Paris", "unit": "celsius"},
    )
    audio = base64.b64decode(reply.message.audio.data)
    heard = realtime_client.audio.transcriptions.create(model=WHISPER, file=("a.wav", audio)).text
    assert wer(sentence, heard) <= 0.3
    wait_idle(http, CHAT)
