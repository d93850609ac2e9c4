"""Whisper's decoder prompt and suppressed tokens, as its `generate` builds them (GenerationConfig).

The prompt is `<|startofprev|> prompt tokens` (when a text prompt is given: its last MAX_PROMPT_TOKENS),
then the start of transcript, the language and task tokens (multilingual models) and `<|notimestamps|>`.
Every step suppresses the config's `suppress_tokens`; the first generated token also
`begin_suppress_tokens` (a blank, the end of text), which is what transformers' logits processors do, so
greedy tokens match its `generate`.
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError

TASKS = ("transcribe", "translate")
# A previous-text prompt keeps its last 223 tokens (Whisper's n_text_ctx // 2 - 1), as OpenAI's whisper does.
MAX_PROMPT_TOKENS = 223


def language_token(gen: Any, language: str) -> int:
    """The id of `<|xx|>` for a language code ("en", or "<|en|>")."""
    table = getattr(gen, "lang_to_id", None) or {}
    token = language if language.startswith("<|") else f"<|{language.lower()}|>"
    if token not in table:
        codes = ", ".join(sorted(t.strip("<|>") for t in table)) or "none"
        raise InvalidRequestError(
            f"language: {language!r} is not one of this model's ({codes})", param="language"
        )
    return int(table[token])


def decoder_prompt(
    gen: Any, tokenizer: Any, language: str | None, task: str, prompt: str | None = None
) -> list[int]:
    """The forced decoder tokens for one segment."""
    if task not in TASKS:
        raise InvalidRequestError(f"task must be one of {TASKS}, got {task!r}", param="task")
    ids: list[int] = []
    if prompt and prompt.strip():
        text = tokenizer.encode(" " + prompt.strip(), add_special_tokens=False)
        ids = [int(gen.prev_sot_token_id)] + text[-(MAX_PROMPT_TOKENS):]
    ids.append(int(gen.decoder_start_token_id))
    if getattr(gen, "is_multilingual", False):
        ids.append(language_token(gen, language or "en"))
        ids.append(int(gen.task_to_id[task]))
    else:
        if language and language.strip("<|>").lower() != "en":
            raise InvalidRequestError(
                f"language: this model is English-only, got {language!r}", param="language"
            )
        if task != "transcribe":
            raise InvalidRequestError(
                "this model is English-only: it transcribes but cannot translate", param="task"
            )
    ids.append(int(gen.no_timestamps_token_id))
    return ids


def can_translate(gen: Any) -> bool:
    return bool(
        getattr(gen, "is_multilingual", False) and "translate" in (getattr(gen, "task_to_id", None) or {})
    )


class SuppressTokens:
    """`fn(output_token_ids, logits) -> logits`: the config's suppressed tokens at every step, its begin
    tokens at the first."""

    def __init__(self, suppress: list[int], begin: list[int]):
        self.suppress = torch.tensor(sorted(set(suppress)), dtype=torch.long)
        self.begin = torch.tensor(sorted(set(begin) | set(suppress)), dtype=torch.long)

    def __call__(self, output_token_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        ids = self.begin if not output_token_ids else self.suppress
        return logits.index_fill(-1, ids.to(logits.device), float("-inf"))
