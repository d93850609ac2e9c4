"""Cutting text that arrives in pieces into sentences, so each can be spoken as soon as it is complete.

Generic on purpose (serving names no model family): a sentence ends at `.`, `!`, `?` or `…` (with any closing
quotes or brackets) followed by whitespace, or at a CJK full stop, question or exclamation mark. While more
text may come, a mark at the very end does not end a sentence yet ("3." may become "3.5"); once the text is
final, its last sentence ends with it. Pieces with no word in them ("...") are not sentences.
"""

from __future__ import annotations

import re

_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)|(?P<cjk>[。！？]+[”’」』)]*)")
_WORD = re.compile(r"\w")


def split_sentences(text: str, final: bool) -> tuple[list[str], str]:
    """(the complete sentences of `text`, the text after them, still waiting for its end)."""
    pieces: list[str] = []
    start = 0
    for match in _END.finditer(text):
        if match.end() == len(text) and not final and not match.group("cjk"):
            break
        pieces.append(text[start : match.end()])
        start = match.end()
    rest = text[start:].lstrip() if start else text
    if final:
        pieces.append(rest)
        rest = ""
    return [p.strip() for p in pieces if _WORD.search(p)], rest
