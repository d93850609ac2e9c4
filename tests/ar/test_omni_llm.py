"""A plain LLM directory served end to end through the public API (resolver → deploy YAML → stage)."""

from __future__ import annotations

import pytest

from omnistage import Omni, SamplingParams
from omnistage.families.llm.tiny import tiny_llm_dir
from tests.ar.ar_helpers import hf_greedy, hf_tokenizer

PROMPTS = [[5, 17, 301, 42, 99, 7], list(range(30, 75)), [250, 251, 252]]


@pytest.mark.e2e
@pytest.mark.parametrize("placement", ["process", "inline"])
def test_omni_generate_on_an_llm_directory_equals_transformers_greedy(placement: str) -> None:
    tokenizer = hf_tokenizer("qwen2")
    params = SamplingParams(temperature=0.0, max_tokens=12)
    with Omni(tiny_llm_dir("qwen2"), placement=placement, dtype="float32", num_threads=1) as omni:
        assert omni.pipeline.name == "llm"
        outs = omni.generate(
            [{"prompt_token_ids": p} for p in PROMPTS] + ["Hello 🦙 world"], params, use_tqdm=False
        )
    text_ids = tokenizer("Hello 🦙 world")["input_ids"]
    for out, prompt in zip(outs, [*PROMPTS, text_ids], strict=True):
        assert out.finished and out.error is None
        assert out.token_ids == hf_greedy("qwen2", tuple(prompt), 12)
        assert out.prompt_token_ids == prompt
        assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)
        assert out.finish_reason in ("stop", "length")
