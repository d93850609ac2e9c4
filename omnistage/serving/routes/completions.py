"""POST /v1/completions: text in, text out, plain or streamed (SSE). Without `max_tokens`: OpenAI's 16
(under the model's own defaults)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from omnistage.errors import InvalidRequestError, OmniError
from omnistage.outputs import OmniRequestOutput
from omnistage.serving.context import ServerContext, get_context
from omnistage.serving.errors import omni_error_body
from omnistage.serving.generation import collect, generate, merge, prime, unless_disconnected
from omnistage.serving.prompt_tokens import check_text_tokens
from omnistage.serving.protocol import CompletionRequest
from omnistage.serving.sse import DONE, SSE_HEADERS, sse
from omnistage.serving.stage_params import build_stage_params, sampling_fields

router = APIRouter()
Prompt = str | list[int]
DEFAULT_MAX_TOKENS = 16  # OpenAI's


def _prompts(body: CompletionRequest) -> list[Prompt]:
    """The request's prompts: one string, a token list, or a batch of either."""
    prompt = body.prompt
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompts = [prompt]
    else:
        prompts = list(prompt)
    if not prompts or any(len(p) == 0 for p in prompts):
        raise InvalidRequestError("prompt must not be empty", param="prompt")
    return prompts


def _check_unsupported(body: CompletionRequest, prompts: list[Prompt]) -> None:
    if body.suffix:
        raise InvalidRequestError("suffix is not supported", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise InvalidRequestError("best_of must equal n (candidates are not ranked)", param="best_of")
    if body.echo and not all(isinstance(p, str) for p in prompts):
        raise InvalidRequestError("echo needs text prompts, not token ids", param="echo")


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, ctx: ServerContext = Depends(get_context)):
    if body.logprobs is not None:
        raise InvalidRequestError("logprobs: not supported by this server yet", param="logprobs")
    model = ctx.models.get(body.model, produces=["text"], route="/v1/completions", serves="completions")
    prompts = _prompts(body)
    _check_unsupported(body, prompts)
    limits = model.limits(ctx.settings)
    for prompt in prompts:
        check_text_tokens(model, prompt, limits)
    request_id = f"cmpl-{uuid.uuid4().hex}"
    streams, echoes = [], []
    for p_index, prompt in enumerate(prompts):
        for j in range(body.n):
            sampling = sampling_fields(body, max_tokens=body.max_tokens)
            if body.seed is not None:
                sampling["seed"] = body.seed + j
            params = build_stage_params(
                model,
                sampling=sampling,
                stage_params=body.stage_params,
                route_defaults={"max_tokens": DEFAULT_MAX_TOKENS},
                limits=limits,
            )
            rid = request_id if len(prompts) * body.n == 1 else f"{request_id}-{p_index * body.n + j}"
            streams.append(generate(model, ctx.metrics, prompt, params, rid, ["text"]))
            echoes.append(prompt if body.echo else "")
    reply = _Reply(request_id, model.name, body.n)
    if body.stream:
        primed = await unless_disconnected(request, prime(streams))
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(
            _stream_events(reply, primed, echoes, include_usage),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    outputs = await unless_disconnected(request, collect(streams))
    return reply.completion(outputs, echoes)


class _Reply:
    def __init__(self, request_id: str, model: str, n: int):
        self.id = request_id
        self.model = model
        self.n = n
        self.created = int(time.time())

    def _base(self) -> dict[str, Any]:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model}

    def completion(self, outputs: list[OmniRequestOutput], echoes: list[str]) -> dict[str, Any]:
        choices = [
            {
                "index": i,
                "text": echo + out.text,
                "logprobs": None,
                "finish_reason": out.finish_reason or "stop",
            }
            for i, (out, echo) in enumerate(zip(outputs, echoes, strict=True))
        ]
        return {**self._base(), "choices": choices, "usage": self.usage(outputs)}

    def usage(self, outputs: list[OmniRequestOutput]) -> dict[str, int]:
        """Prompt tokens count once per prompt (not once per sampled choice)."""
        prompt = sum(len(out.prompt_token_ids) for out in outputs[:: self.n])
        completion = sum(len(out.token_ids) for out in outputs)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def chunk(self, index: int, text: str, finish_reason: str | None = None) -> str:
        choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return sse({**self._base(), "choices": [choice]})


async def _stream_events(
    reply: _Reply, streams: list[AsyncIterator[OmniRequestOutput]], echoes: list[str], include_usage: bool
) -> AsyncIterator[str]:
    finals: list[Any] = [None] * len(streams)
    for index, echo in enumerate(echoes):
        if echo:
            yield reply.chunk(index, echo)
    try:
        async for index, out in merge(streams):
            if out.error is not None:
                raise out.error
            if out.delta_text:
                yield reply.chunk(index, out.delta_text)
            if out.finished:
                finals[index] = out
                yield reply.chunk(index, "", out.finish_reason or "stop")
        if include_usage:
            yield sse({**reply._base(), "choices": [], "usage": reply.usage(finals)})
    except OmniError as exc:
        yield sse(omni_error_body(exc))
    yield DONE
