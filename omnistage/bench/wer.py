"""Word error rate, as the speech tests and benchmarks score transcriptions: the normaliser keeps lower-case
words of letters and apostrophes, and the errors are the word-level edit distance to the reference."""

from __future__ import annotations

import re


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit distance in words, reference length)."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)], len(ref)


def corpus_wer(references: list[str], hypotheses: list[str]) -> float:
    """All the word errors over all the reference words."""
    pairs = [word_errors(r, h) for r, h in zip(references, hypotheses, strict=True)]
    return sum(e for e, _ in pairs) / max(sum(n for _, n in pairs), 1)
