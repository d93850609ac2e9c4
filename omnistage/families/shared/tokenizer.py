"""Tokenizers for the tiny checkpoints, built locally with the `tokenizers` library (nothing is downloaded).

A byte-level BPE trained on a small fixed corpus, so it is deterministic; characters the corpus lacks
(emoji, rare CJK) stay split over several byte tokens, which is exactly what incremental detokenization
must get right. Each family gets its real special tokens and chat template.
"""

from __future__ import annotations

import random
from pathlib import Path

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a small model that learned to speak, sing and paint.",
    "omnistage serves any-to-any multimodal models as graphs of stages.",
    "A thinker writes text, a talker speaks it, and a vocoder turns codes into sound.",
    "Hello world! How are you today? I am fine, thank you.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828",
    "def main():\n    print('hello')\n    return 0\n",
    "你好，世界。今天天气很好。我们一起学习。",
    "Bonjour le monde. Guten Tag. ¿Qué tal? Ça va très bien.",
    "user assistant system: please answer the question briefly and politely.",
]

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_CHAT = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]
LLAMA_CHAT = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)

FAMILIES = {
    # family: (special tokens, chat template, bos, eos, generation eos list)
    "qwen": (QWEN_SPECIALS, QWEN_CHAT, None, "<|endoftext|>", ["<|im_end|>", "<|endoftext|>"]),
    "llama": (
        LLAMA_SPECIALS,
        LLAMA_CHAT,
        "<|begin_of_text|>",
        "<|end_of_text|>",
        ["<|eot_id|>", "<|end_of_text|>"],
    ),
}


def _synthetic_words(count: int, seed: int) -> list[str]:
    """Deterministic pseudo-words: enough distinct byte pairs for the trainer to reach a large vocabulary."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        " ".join("".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(16)) for _ in range(count)
    ]


def build_tokenizer(path: Path, family: str, vocab_size: int) -> dict[str, int]:
    """Train and save a tokenizer of exactly `vocab_size` ids (specials last); returns the special ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials, chat, bos, eos, _ = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    target = vocab_size - len(specials)
    trainer = trainers.BpeTrainer(
        vocab_size=target, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    corpus = CORPUS * 8
    if target > 2000:
        corpus = corpus + _synthetic_words(target // 2, seed=0)
    tok.train_from_iterator(corpus, trainer)
    # A small corpus cannot reach the target: plain added tokens fill the gap (they decode as text).
    tok.add_tokens([f"<|reserved_{i}|>" for i in range(target - tok.get_vocab_size())])
    tok.add_special_tokens(specials)
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=eos, clean_up_tokenization_spaces=False
    )
    fast.chat_template = chat
    fast.save_pretrained(str(path))
    return {token: tok.token_to_id(token) for token in specials}


def generation_eos_ids(family: str, special_ids: dict[str, int]) -> list[int]:
    return [special_ids[t] for t in FAMILIES[family][4]]
