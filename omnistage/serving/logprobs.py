"""The AR stage's per-token log-probabilities in the OpenAI chat shape.

A stage reports ids (`{"token_id", "logprob", "top": {id: logprob}}`, stages/ar/sampler.py); clients read
`{"token", "logprob", "bytes", "top_logprobs": [...]}`, so the ids become text with the model's tokenizer
(vLLM's `token_id:N` form where the model directory has none).
"""

from __future__ import annotations

from typing import Any


class TokenLogprobs:
    def __init__(self, tokenizer: Any | None):
        self.tokenizer = tokenizer

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        if self.tokenizer is None:
            text = f"token_id:{token_id}"
        else:
            text = self.tokenizer.decode([token_id])
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8"))}

    def content(self, entries: list[Any]) -> list[dict[str, Any]]:
        """`choices[i].logprobs.content`: one item per generated token."""
        content = []
        for entry in entries:
            item = self._token(int(entry["token_id"]), entry["logprob"])
            top = sorted(((int(t), lp) for t, lp in (entry.get("top") or {}).items()), key=lambda x: -x[1])
            item["top_logprobs"] = [self._token(t, lp) for t, lp in top]
            content.append(item)
        return content
