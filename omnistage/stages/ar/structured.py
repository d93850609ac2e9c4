"""Structured outputs: a request's output held to a JSON schema, any JSON object, a regex, a choice of
strings or an EBNF grammar, with xgrammar (what vLLM uses).

The constraint compiles once per (tokenizer, kind, value) (an LRU of compiled grammars: the same schema
from many requests is compiled once) and runs as the request's logits processor: each sequence keeps a
matcher fed the tokens it sampled, whose token bitmask leaves only the tokens the grammar allows next (the
stop tokens once it may end; only them once it must). Requests with other constraints, or none, share the
batch: the mask is per row.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.params import StructuredOutputs

NEG_INF = float("-inf")
COMPILED_KEPT = 256
WHITESPACE_RUN = 2
_compilers: dict[tuple, Any] = {}
_grammars: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
_lock = threading.Lock()


def constraint(
    spec: StructuredOutputs, tokenizer: Any, vocab_size: int, stops: tuple[int, ...] = ()
) -> GrammarConstraint:
    """The logits processor holding a request to `spec` (a 400 naming the field it came from when xgrammar
    cannot compile it). `stops`: the ids that end the request's sequences (the model's EOS, the request's
    stop ids): the grammar allows them only where it may end, never as text (an added token such as
    `<|im_end|>` is otherwise a valid piece of a JSON string)."""
    if tokenizer is None:
        raise InvalidRequestError(
            f"{spec.source}: this model has no tokenizer to constrain", param=spec.source
        )
    kind, value = spec.kind()
    stops = tuple(sorted(set(stops) or {tokenizer.eos_token_id} - {None}))
    try:
        grammar = _compiled(tokenizer, vocab_size, stops, kind, value)
    except (RuntimeError, ValueError, TypeError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidRequestError(f"{spec.source}: cannot be compiled ({reason})", param=spec.source) from exc
    return GrammarConstraint(grammar, vocab_size)


def _compiler(tokenizer: Any, vocab_size: int, stops: tuple[int, ...]) -> Any:
    import xgrammar

    key = (id(tokenizer), vocab_size, stops)
    with _lock:
        if key not in _compilers:
            info = xgrammar.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=vocab_size, stop_token_ids=list(stops) or None
            )
            _compilers[key] = xgrammar.GrammarCompiler(info, max_threads=1)
        return _compilers[key]


def _compiled(tokenizer: Any, vocab_size: int, stops: tuple[int, ...], kind: str, value: str) -> Any:
    """The compiled grammar, from the cache (the most recent COMPILED_KEPT) or compiled now."""
    key = (id(tokenizer), vocab_size, stops, kind, value)
    with _lock:
        if key in _grammars:
            _grammars.move_to_end(key)
            return _grammars[key]
    grammar = _compile(_compiler(tokenizer, vocab_size, stops), kind, value)
    with _lock:
        _grammars[key] = grammar
        while len(_grammars) > COMPILED_KEPT:
            _grammars.popitem(last=False)
    return grammar


def _compile(compiler: Any, kind: str, value: str) -> Any:
    # JSON as models write it, with at most WHITESPACE_RUN blanks in a row where JSON allows them (a small
    # model let free spends its tokens on blanks and never closes the object)
    if kind == "json":
        return compiler.compile_json_schema(value, strict_mode=True, max_whitespace_cnt=WHITESPACE_RUN)
    if kind == "json_object":
        return compiler.compile_json_schema(
            '{"type": "object"}', strict_mode=False, max_whitespace_cnt=WHITESPACE_RUN
        )
    if kind == "regex":
        return compiler.compile_regex(value)
    if kind == "choice":
        options = json.loads(value)
        return compiler.compile_grammar(
            "root ::= " + " | ".join(json.dumps(o, ensure_ascii=False) for o in options)
        )
    return compiler.compile_grammar(value)


class GrammarConstraint:
    """`fn(output_ids, logits[V]) -> logits` for one request: a matcher per sequence (a request with n
    sequences calls it with each one's own token list), fed the tokens sampled since its last call; a
    sequence that restarts (preempted, recomputed) starts its matcher over."""

    def __init__(self, grammar: Any, vocab_size: int):
        import xgrammar

        self.grammar, self.vocab_size = grammar, vocab_size
        self.matchers: dict[int, tuple[Any, list[int]]] = {}  # id(output ids) → matcher, tokens it took
        self.bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self.stops = torch.tensor(grammar.tokenizer_info.stop_token_ids, dtype=torch.long)

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        import xgrammar

        matcher, taken = self._matcher(output_ids)
        for token in output_ids[len(taken) :]:
            if not matcher.is_terminated() and not matcher.accept_token(token):
                raise RuntimeError(f"token {token} breaks the structured output's grammar")
            taken.append(token)
        if matcher.is_terminated():  # it ended: nothing but a stop token
            kept = torch.full_like(logits, NEG_INF)
            kept[self.stops] = logits[self.stops]
            return kept
        matcher.fill_next_token_bitmask(self.bitmask)
        width = logits.shape[-1]
        view = logits[None, : self.vocab_size] if width >= self.vocab_size else logits[None]
        xgrammar.apply_token_bitmask_inplace(view, self.bitmask[:, : (view.shape[-1] + 31) // 32])
        if width > self.vocab_size:
            logits[self.vocab_size :] = NEG_INF  # a head wider than the tokenizer: ids no text has
        return logits

    def _matcher(self, output_ids: list[int]) -> tuple[Any, list[int]]:
        import xgrammar

        key = id(output_ids)
        matcher, taken = self.matchers.get(key, (None, []))
        if matcher is None or output_ids[: len(taken)] != taken:
            matcher, taken = xgrammar.GrammarMatcher(self.grammar), []
            self.matchers[key] = (matcher, taken)
        return matcher, taken
