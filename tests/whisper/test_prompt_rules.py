"""Whisper's forced decoder prompt and suppressed tokens as GenerationConfig defines them, and the AR
engine's encoder-decoder inputs refused when malformed (the request fails, naming the field)."""

from __future__ import annotations

import types

import pytest
import torch

from omnistage.errors import InvalidRequestError
from omnistage.families.whisper.decoding import MAX_PROMPT_TOKENS, SuppressTokens, decoder_prompt
from omnistage.stages.ar.ar_inputs import ARInputs
from omnistage.stages.ar.cross_attention import encoder_states

pytestmark = pytest.mark.unit

MULTILINGUAL = types.SimpleNamespace(
    is_multilingual=True,
    decoder_start_token_id=50258,
    no_timestamps_token_id=50363,
    prev_sot_token_id=50361,
    lang_to_id={"<|en|>": 50259, "<|de|>": 50261},
    task_to_id={"transcribe": 50359, "translate": 50358},
)
ENGLISH = types.SimpleNamespace(
    is_multilingual=False, decoder_start_token_id=50257, no_timestamps_token_id=50362, prev_sot_token_id=50360
)


class _Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_multilingual_prompt_has_language_and_task_tokens():
    assert decoder_prompt(MULTILINGUAL, _Tokenizer(), "de", "translate") == [50258, 50261, 50358, 50363]
    assert decoder_prompt(MULTILINGUAL, _Tokenizer(), None, "transcribe") == [50258, 50259, 50359, 50363]
    with pytest.raises(InvalidRequestError) as info:
        decoder_prompt(MULTILINGUAL, _Tokenizer(), "xx", "transcribe")
    assert info.value.param == "language"


def test_english_only_prompt_and_previous_text():
    assert decoder_prompt(ENGLISH, _Tokenizer(), "en", "transcribe") == [50257, 50362]
    assert decoder_prompt(ENGLISH, _Tokenizer(), None, "transcribe", "Hi") == [
        50360,
        32,
        72,
        105,
        50257,
        50362,
    ]
    long = decoder_prompt(ENGLISH, _Tokenizer(), None, "transcribe", "a" * 500)
    assert len(long) == 1 + MAX_PROMPT_TOKENS + 2
    for language, task, param in (("de", "transcribe", "language"), (None, "translate", "task")):
        with pytest.raises(InvalidRequestError) as info:
            decoder_prompt(ENGLISH, _Tokenizer(), language, task)
        assert info.value.param == param


def test_suppressed_tokens_at_every_step_and_begin_tokens_at_the_first():
    fn = SuppressTokens([3, 5], [1])
    first, later = fn([], torch.zeros(8)), fn([7], torch.zeros(8))
    assert torch.isinf(first).nonzero().flatten().tolist() == [1, 3, 5]
    assert torch.isinf(later).nonzero().flatten().tolist() == [3, 5]


def test_encoder_states_one_shared_or_one_per_sequence():
    a, b = torch.zeros(5, 4), torch.ones(6, 4)
    assert encoder_states(ARInputs(encoder_hidden_states=a), 3, 4) == [a, a, a]
    assert encoder_states(ARInputs(encoder_hidden_states=[a, b]), 2, 4) == [a, b]
    for states in (None, [a, b], torch.zeros(5, 3)):
        with pytest.raises(InvalidRequestError) as info:
            encoder_states(ARInputs(encoder_hidden_states=states), 3, 4)
        assert info.value.param == "encoder_hidden_states"
