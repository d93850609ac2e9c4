"""A model's `max_input_tokens` limit, checked on the server before a prompt reaches a stage.

Only where the model declares the limit: counting needs its tokenizer (and, for chat, its template), work the
entry stage repeats. A prompt longer than the model's context is refused by its stage either way, with both
lengths in the message.
"""

from __future__ import annotations

import logging
from typing import Any

from omnistage.config.capabilities import Limits
from omnistage.serving.limits import check_prompt_tokens
from omnistage.serving.served import ServedModel
from omnistage.tool_prompts import render_chat

logger = logging.getLogger(__name__)


def check_chat_tokens(
    model: ServedModel,
    messages: list[dict[str, Any]],
    limits: Limits,
    tools: list[dict[str, Any]] | None = None,
) -> None:
    if limits.max_input_tokens is None or model.tokenizer is None:
        return
    try:
        ids = render_chat(model.tokenizer, messages, tools, add_generation_prompt=True, tokenize=True)
    except Exception as exc:  # no template, media parts it cannot render: the stage decides
        logger.info("cannot count the chat prompt's tokens for %s: %s", model.name, exc)
        return
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    check_prompt_tokens(len(ids), limits, "messages")


def check_text_tokens(model: ServedModel, prompt: str | list[int], limits: Limits) -> None:
    if limits.max_input_tokens is None:
        return
    if isinstance(prompt, str):
        if model.tokenizer is None:
            return
        prompt = model.tokenizer(prompt)["input_ids"]
    check_prompt_tokens(len(prompt), limits, "prompt")
