"""Tokenizers for the tiny demo checkpoints, learned locally and deterministically.

Each builder returns the `transformers` tokenizer class the real checkpoint ships (CLIP, T5, Qwen2) backed by
the `tokenizers` library, with the family's special tokens at their real ids, so pipelines that look tokens up
by id (CLIP's pooled EOS, Qwen's chat template) behave as on the real models. Vocabularies stay tiny; ids
between the learned pieces and a special token's real id are unreachable filler entries.

The `tokenizers` trainers break frequency ties in hash order (two runs give two vocabularies), so the BPE
merges and unigram pieces are learned here with explicit tie-breaking instead.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable

from tokenizers import pre_tokenizers

CORPUS = [
    "a cat sitting on a bench in the sun",
    "a red fox running through the snowy forest at dawn",
    "an astronaut riding a horse on the moon, cinematic lighting",
    "a bowl of fruit on a wooden table, studio photo",
    "waves crashing on a rocky shore under a stormy sky",
    "a small robot painting a picture of a city skyline",
    "the quick brown fox jumps over the lazy dog",
    "a watercolor painting of mountains and a quiet lake",
    "low quality, blurry, distorted, ugly, bad anatomy",
    "you are a helpful assistant. describe the image by detailing the color, shape, size, texture",
    "quantity, text, spatial relationships of the objects and background",
    "system user assistant image video text prompt negative",
]

CLIP_BOS_ID, CLIP_EOS_ID = 49406, 49407
QWEN_SPECIAL_TOKENS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
}
BYTE_ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())


def _words(split: Callable[[str], list[tuple[str, tuple[int, int]]]]) -> collections.Counter:
    return collections.Counter(word for text in CORPUS for word, _ in split(text))


def _learn_bpe(words: collections.Counter, num_merges: int, suffix: str = "") -> list[tuple[str, str]]:
    """Classic BPE: merge the most frequent adjacent pair; ties go to the lexicographically smallest pair."""
    splits = {}
    for word in words:
        symbols = list(word)
        symbols[-1] += suffix
        splits[word] = symbols
    merges = []
    for _ in range(num_merges):
        pairs = collections.Counter()
        for word, symbols in splits.items():
            for pair in zip(symbols, symbols[1:], strict=False):
                pairs[pair] += words[word]
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        for word, symbols in splits.items():
            i, out = 0, []
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            splits[word] = out
    return merges


def _bpe_vocab(
    alphabet: list[str], merges: list[tuple[str, str]], specials: dict[str, int]
) -> dict[str, int]:
    """Alphabet, then merged symbols, then `specials` at their fixed ids with fillers in between."""
    vocab: dict[str, int] = {}
    for symbol in [*alphabet, *(a + b for a, b in merges)]:
        vocab.setdefault(symbol, len(vocab))
    for token, token_id in sorted(specials.items(), key=lambda kv: kv[1]):
        while len(vocab) < token_id:
            vocab[f"<|filler_{len(vocab)}|>"] = len(vocab)
        vocab[token] = token_id
    return vocab


def clip_tokenizer():
    """A CLIP BPE tokenizer (77 tokens, BOS 49406, EOS 49407) as `transformers.CLIPTokenizer`."""
    from transformers import CLIPTokenizer

    backend = CLIPTokenizer()._tokenizer
    words = _words(lambda t: backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(t)))
    merges = _learn_bpe(words, 300, suffix="</w>")
    alphabet = BYTE_ALPHABET + [c + "</w>" for c in BYTE_ALPHABET]
    vocab = _bpe_vocab(alphabet, merges, {"<|startoftext|>": CLIP_BOS_ID, "<|endoftext|>": CLIP_EOS_ID})
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=77)


def qwen2_tokenizer(specials: dict[str, int] | None = None):
    """A Qwen2 byte-level BPE tokenizer with the chat/vision special tokens at Qwen's real ids (or
    `specials`: token → id, "<|endoftext|>" among them)."""
    from transformers import Qwen2Tokenizer

    specials = QWEN_SPECIAL_TOKENS if specials is None else specials
    backend = Qwen2Tokenizer()._tokenizer
    merges = _learn_bpe(_words(backend.pre_tokenizer.pre_tokenize_str), 300)
    vocab = _bpe_vocab(BYTE_ALPHABET, merges, specials)
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, model_max_length=32768)
    tok.add_special_tokens({"additional_special_tokens": [t for t in specials if t != "<|endoftext|>"]})
    return tok


def t5_tokenizer(model_max_length: int = 512):
    """A T5 unigram tokenizer (pad 0, eos 1, unk 2 as in T5/UMT5) as `transformers.T5Tokenizer`.

    Pieces are the corpus words and single characters, scored by log frequency, so any text segments.
    """
    from transformers import T5Tokenizer

    backend = T5Tokenizer(extra_ids=0)._tokenizer
    words = _words(backend.pre_tokenizer.pre_tokenize_str)
    chars = collections.Counter(c for word, n in words.items() for c in word for _ in range(n))
    counts = {**{c: n for c, n in chars.items()}, **{w: n for w, n in words.items() if len(w) > 1}}
    total = sum(counts.values())
    pieces = sorted(counts, key=lambda p: (-counts[p], p))
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(p, math.log(counts[p] / total)) for p in pieces]
    return T5Tokenizer(vocab=vocab, extra_ids=0, model_max_length=model_max_length)


LLAMA3_SPECIAL_TOKENS = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001}


def llama3_tokenizer(extra_specials: dict[str, int] | None = None, pad_token: str | None = None):
    """A Llama 3 byte-level BPE tokenizer (BOS 128000 added in front, EOS 128001) as
    `transformers.PreTrainedTokenizerFast`, with `extra_specials` (token → its real id) beside them and
    `pad_token` (one of them) for padded batches."""
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    specials = {**LLAMA3_SPECIAL_TOKENS, **(extra_specials or {})}
    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    merges = _learn_bpe(_words(split.pre_tokenize_str), 300)
    vocab = _bpe_vocab(BYTE_ALPHABET, merges, specials)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = split
    backend.decoder = decoders.ByteLevel()
    bos = "<|begin_of_text|>"
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, specials[bos])]
    )
    backend.add_special_tokens(list(specials))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token="<|end_of_text|>",
        pad_token=pad_token,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
