"""Incremental detokenization: text deltas from a growing list of token ids.

Byte-level BPE splits a multi-byte UTF-8 character (an emoji, most CJK characters) over several tokens, so
decoding each new token alone yields U+FFFD garbage. Instead we decode a short window that ends at the
newest token and emit only what extends the window's already-emitted prefix, holding text back while it
ends in an incomplete character (the scheme vLLM uses).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

REPLACEMENT = "\ufffd"
PREFIX_WINDOW = 6  # tokens of context kept before the unread ones, so merges/spaces decode as in full text


def decoder_for(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """The fastest decode that still matches `tokenizer.decode`: the Rust tokenizer when transformers
    would add no post-processing of its own."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[list[int]], str], prompt_token_ids: list[int]):
        self._decode = decode
        self.read_offset = len(prompt_token_ids)
        self.prefix_offset = max(self.read_offset - PREFIX_WINDOW, 0)

    def step(self, token_ids: list[int]) -> str:
        """New text after `token_ids` grew (all ids, prompt included); "" while a character is incomplete."""
        prefix_text = self._decode(token_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(token_ids[self.prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT):
            self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
            return full_text[len(prefix_text) :]
        return ""

    def flush(self, token_ids: list[int]) -> str:
        """At the end: whatever is still held back, incomplete characters included."""
        prefix_text = self._decode(token_ids[self.prefix_offset : self.read_offset])
        full_text = self._decode(token_ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(token_ids)
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""
