"""SmolLM2-135M-Instruct (trained weights, dequantized from the demo's GGUF) through a real server:
greedy answers equal transformers' greedy `generate` on the same weights, token for token, in float32."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
import torch

pytestmark = pytest.mark.e2e

# Questions this model answers correctly and briefly (each ends its turn within MAX_TOKENS).
QUESTIONS = [
    "What is the capital of France?",
    "What is the capital of Germany?",
    "What is 2 plus 2?",
    "What is the largest ocean on Earth?",
]
MAX_TOKENS = 48
END_OF_TURN = "<|im_end|>"


def greedy_reference(reference, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    model, tokenizer = reference
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=2
        )
    return out[0, len(prompt_ids) :].tolist()


def chat_ids(reference, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return list(reference[1].apply_chat_template(messages, add_generation_prompt=True, return_dict=False))


def client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def test_greedy_chat_equals_transformers(smol_server, reference, one_thread) -> None:
    """All questions at once (batched in the engine); each answer ends at the end-of-turn token."""

    async def ask_all():
        api = client(smol_server)
        return await asyncio.gather(
            *[
                api.chat.completions.create(
                    model="smollm2-135m-instruct",
                    messages=[{"role": "user", "content": q}],
                    temperature=0,
                    max_tokens=MAX_TOKENS,
                )
                for q in QUESTIONS
            ]
        )

    replies = asyncio.run(ask_all())
    tokenizer = reference[1]
    eot = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    for question, reply in zip(QUESTIONS, replies, strict=True):
        prompt_ids = chat_ids(reference, question)
        expected = greedy_reference(reference, prompt_ids, MAX_TOKENS)
        assert expected[-1] == eot and len(expected) < MAX_TOKENS, "reference answer must end its turn"
        choice = reply.choices[0]
        assert choice.message.content == tokenizer.decode(expected, skip_special_tokens=True), question
        assert choice.finish_reason == "stop"
        assert reply.usage.prompt_tokens == len(prompt_ids)
        assert reply.usage.completion_tokens == len(expected)  # the end-of-turn token counts, as in vLLM
        assert reply.usage.total_tokens == len(prompt_ids) + len(expected)
    answers = [reply.choices[0].message.content for reply in replies]
    facts = ["Paris", "Berlin", "4", "Pacific"]
    assert [fact in answer for fact, answer in zip(facts, answers, strict=True)] == [True] * 4, answers


def test_streaming_chat_equals_non_streaming(smol_server) -> None:
    body = {
        "messages": [{"role": "user", "content": QUESTIONS[0]}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    }
    whole = httpx.post(smol_server.url + "/v1/chat/completions", json=body, timeout=300).json()

    async def stream():
        api = client(smol_server)
        chunks = await api.chat.completions.create(
            **body, model="smollm2-135m-instruct", stream=True, stream_options={"include_usage": True}
        )
        return [chunk async for chunk in chunks]

    chunks = asyncio.run(stream())
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert "".join(deltas) == whole["choices"][0]["message"]["content"]
    assert len([d for d in deltas if d]) > 1, "the answer must arrive in pieces"
    assert finishes == ["stop"] == [whole["choices"][0]["finish_reason"]]
    assert chunks[-1].usage.model_dump(exclude_none=True) == whole["usage"]
    assert END_OF_TURN not in "".join(deltas)


def test_greedy_completion_equals_transformers(smol_server, reference, one_thread) -> None:
    """Plain text continuation (no chat template, no BOS: the GGUF says add_bos_token=false); it runs
    to max_tokens."""
    prompt = "The three primary colors are"
    prompt_ids = reference[1](prompt)["input_ids"]
    expected = greedy_reference(reference, prompt_ids, 16)
    reply = httpx.post(
        smol_server.url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 16, "temperature": 0},
        timeout=300,
    ).json()
    assert reply["model"] == "smollm2-135m-instruct"
    assert reply["choices"][0]["text"] == reference[1].decode(expected)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": 16,
        "total_tokens": len(prompt_ids) + 16,
    }


LONG_QUESTION = "What is photosynthesis? Answer in one sentence."  # a greedy answer of 22 tokens


def test_chat_without_max_tokens_runs_to_the_end_of_the_turn(smol_server, reference, one_thread) -> None:
    """OpenAI's chat default (as vLLM): no max_tokens means up to the context minus the prompt, not 16."""
    model, tokenizer = reference
    prompt_ids = chat_ids(reference, LONG_QUESTION)
    expected = greedy_reference(reference, prompt_ids, model.config.max_position_embeddings - len(prompt_ids))
    assert len(expected) > 16 and expected[-1] == tokenizer.convert_tokens_to_ids(END_OF_TURN)
    body = {"messages": [{"role": "user", "content": LONG_QUESTION}], "temperature": 0}
    reply = httpx.post(smol_server.url + "/v1/chat/completions", json=body, timeout=300).json()
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == tokenizer.decode(expected, skip_special_tokens=True)
    assert reply["usage"]["completion_tokens"] == len(expected)


def test_completions_without_max_tokens_give_openais_16(smol_server, reference) -> None:
    reply = httpx.post(
        smol_server.url + "/v1/completions",
        json={"prompt": "Once upon a time", "temperature": 0},
        timeout=300,
    ).json()
    assert reply["usage"]["completion_tokens"] == 16 and reply["choices"][0]["finish_reason"] == "length"


def test_a_prompt_longer_than_the_context_is_a_400_naming_the_lengths(smol_server, reference) -> None:
    context = reference[0].config.max_position_embeddings
    response = httpx.post(
        smol_server.url + "/v1/completions",
        json={"prompt": [1] * (context + 5), "max_tokens": 1},
        timeout=300,
    )
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert str(context + 5) in message and str(context) in message


def test_chat_logprobs_equal_transformers_log_softmax(smol_server, reference, one_thread) -> None:
    """Through the official client: each token's logprob and its top 3 equal transformers' log-softmax
    scores over the same prefix; streamed chunks carry the same entries."""
    model, tokenizer = reference
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": QUESTIONS[0]}],
        "temperature": 0,
        "max_tokens": 8,
        "logprobs": True,
        "top_logprobs": 3,
    }

    async def ask():
        api = client(smol_server)
        whole = await api.chat.completions.create(**body)
        chunks = await api.chat.completions.create(**body, stream=True)
        return whole, [c async for c in chunks]

    whole, chunks = asyncio.run(ask())
    content = whole.choices[0].logprobs.content
    prompt_ids = chat_ids(reference, QUESTIONS[0])
    token_ids = greedy_reference(reference, prompt_ids, 8)
    assert len(content) == len(token_ids) == 8
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids + token_ids])).logits[0].float()
    scores = torch.log_softmax(logits[len(prompt_ids) - 1 : -1], dim=-1)
    for i, (item, token_id) in enumerate(zip(content, token_ids, strict=True)):
        assert item.token == tokenizer.decode([token_id])
        assert item.bytes == list(item.token.encode())
        assert abs(item.logprob - scores[i, token_id].item()) < 1e-4
        top = scores[i].topk(3)
        assert [t.token for t in item.top_logprobs] == [tokenizer.decode([t]) for t in top.indices.tolist()]
        for entry, value in zip(item.top_logprobs, top.values.tolist(), strict=True):
            assert abs(entry.logprob - value) < 1e-4
    streamed = [
        i for c in chunks if c.choices and c.choices[0].logprobs for i in c.choices[0].logprobs.content
    ]
    assert [i.model_dump() for i in streamed] == [i.model_dump() for i in content]
