"""Cutting text into the units the voice speaks, the same way whether the text is whole or still arriving.

A unit is a sentence (hibari's own sentence rules), except that a text's first sentence is cut after its
first clause mark (",", ";", ":") that has at least `MIN_CLAUSE_WORDS` words before it: the first audio
then waits for a clause, not a sentence. Because the cut depends only on the text before it (and the character
after it), a text split whole and the same text split as it streams give the same units.
"""

from __future__ import annotations

import re

MIN_CLAUSE_WORDS = 4
_CLAUSE_END = re.compile(r"[,;:]\s+(?=\S)")


def split_sentences(text: str) -> list[str]:
    from hibari import Hibari

    return Hibari.split_sentences(text)


def speech_units(text: str, final: bool, first: bool) -> tuple[list[str], str]:
    """(complete units, the text they leave). With `final`, everything is complete. `first`: no unit has
    been cut from this text's stream yet (its first sentence may be cut at a clause)."""
    units: list[str] = []
    if first:
        clause = _first_clause(text)
        if clause is not None:
            units.append(clause.strip())
            text = text[len(clause) :].lstrip()
    sentences = split_sentences(text)
    if not final:
        # The last sentence may still grow, unless the text already runs past its end.
        complete = sentences[:-1]
        if not complete:
            return units, text
        rest_start = _offset_after(text, complete)
        return units + complete, text[rest_start:]
    return units + sentences, ""


def _first_clause(text: str) -> str | None:
    """The text up to and including the first clause mark of the first sentence with enough words before
    it (and the next word begun, so the mark is not just the end of a stream's chunk)."""
    sentences = split_sentences(text)
    if not sentences:
        return None
    end = len(text) - len(text.lstrip()) + len(sentences[0])
    for match in _CLAUSE_END.finditer(text, 0, end):
        clause = text[: match.start() + 1]
        if len(clause.split()) >= MIN_CLAUSE_WORDS:
            return clause
    return None


def _offset_after(text: str, sentences: list[str]) -> int:
    """Where the text after `sentences` (found in order) begins."""
    position = 0
    for sentence in sentences:
        position = text.index(sentence, position) + len(sentence)
    return position
