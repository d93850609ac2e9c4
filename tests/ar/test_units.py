"""Pure logic of the AR engine: block allocation and prefix caching, incremental detokenization, the
plain-LLM pipeline resolver."""

from __future__ import annotations

import time

import pytest

from omnistage.params import SamplingParams
from omnistage.stages.ar.detokenizer import IncrementalDetokenizer, decoder_for
from omnistage.stages.ar.kv_cache import BlockManager
from omnistage.stages.ar.sequence import ARRequest, Sequence
from omnistage.stages.base import StageRequest
from tests.ar.ar_helpers import hf_tokenizer, make_engine, run


def seq_of(tokens: list[int]) -> Sequence:
    request = ARRequest("u", list(tokens), SamplingParams(), 0, time.monotonic(), {})
    return Sequence(
        request=request,
        index=0,
        token_ids=list(tokens),
        max_tokens=8,
        detokenizer=None,
        max_cacheable_tokens=10**9,
    )


def compute(blocks: BlockManager, seq: Sequence) -> None:
    """Admit with prefix hits, then 'compute' every remaining token."""
    hits = blocks.match_prefix(seq)
    blocks.admit(seq, hits)
    blocks.append(seq, seq.num_tokens - seq.num_computed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    blocks.commit(seq)


@pytest.mark.unit
def test_prefix_blocks_are_shared_by_chained_hash() -> None:
    blocks = BlockManager(num_blocks=9, block_size=4, enable_prefix_caching=True)
    a = seq_of(list(range(10)))  # blocks [0..3] [4..7] + partial
    compute(blocks, a)
    assert blocks.num_free_blocks == 8 - 3
    b = seq_of(list(range(8)) + [50, 51, 52])
    compute(blocks, b)
    assert b.num_cached_tokens == 8 and b.block_table[:2] == a.block_table[:2]
    assert blocks.blocks[a.block_table[0]].ref_count == 2
    c = seq_of([99] + list(range(1, 12)))  # different first block: the chain breaks at once
    assert blocks.match_prefix(c) == []
    d = seq_of(list(range(8)))  # fully cached prompt: the last block is recomputed to get logits
    assert len(blocks.match_prefix(d)) == 1
    assert blocks.prefix_hits == 8 and blocks.prefix_queries == 21


@pytest.mark.unit
def test_freed_cached_blocks_are_revived_or_evicted_lru() -> None:
    blocks = BlockManager(num_blocks=5, block_size=2, enable_prefix_caching=True)  # 4 usable
    a = seq_of([1, 2, 3, 4, 5])
    compute(blocks, a)
    blocks.free_seq(a)
    assert blocks.num_free_blocks == 4
    b = seq_of([1, 2, 3, 4, 9])
    compute(blocks, b)  # revives [1,2] and [3,4] from the free list
    assert b.num_cached_tokens == 4 and blocks.num_free_blocks == 1
    blocks.free_seq(b)
    c = seq_of([7, 7, 8, 8, 6, 6, 5])  # needs all 4 blocks: every cached block gets evicted
    compute(blocks, c)
    assert blocks.num_free_blocks == 0
    assert blocks.match_prefix(seq_of([1, 2, 3, 4, 0])) == []
    blocks.free_seq(c)
    assert blocks.num_free_blocks == 4


@pytest.mark.unit
def test_no_prefix_caching_and_allocation_limits() -> None:
    blocks = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    a = seq_of(list(range(8)))
    compute(blocks, a)
    assert blocks.match_prefix(seq_of(list(range(8)))) == []
    s = seq_of(list(range(9)))
    assert not blocks.can_admit([], 9) and blocks.can_admit([], 4)
    assert s.block_table == []


@pytest.mark.unit
def test_detokenizer_handles_multibyte_characters_split_over_tokens() -> None:
    tokenizer = hf_tokenizer("qwen2")
    text = "Hi 🦙 and 你好世界, ünïcödé ✓ done 🎉🎉"
    ids = tokenizer(text)["input_ids"]
    singles = [tokenizer.decode([i]) for i in ids]
    assert any("\ufffd" in s for s in singles)  # some characters really are split over tokens
    prompt = tokenizer("prefix: ")["input_ids"]
    detok = IncrementalDetokenizer(decoder_for(tokenizer, True), prompt)
    all_ids, deltas = list(prompt), []
    for token in ids:
        all_ids.append(token)
        deltas.append(detok.step(all_ids))
    deltas.append(detok.flush(all_ids))
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.engine
def test_streamed_text_equals_decoding_all_output_tokens() -> None:
    tokenizer = hf_tokenizer("qwen2")
    prompts = ["🦙🦙 llama", "你好世界", "numbers 3.14159", "emoji 🎉 party"]
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=40)
    requests = [StageRequest(f"p{i}", p, params) for i, p in enumerate(prompts)]
    results, deltas = run(make_engine(), requests)
    for rid, result in results.items():
        assert "".join(d.text for d in deltas[rid]) == tokenizer.decode(
            result.token_ids, skip_special_tokens=True
        )


@pytest.mark.unit
def test_llm_directories_resolve_to_a_one_stage_text_pipeline(qwen2_dir: str) -> None:
    from omnistage.config.deploy import resolve_deploy
    from omnistage.families.llm.tiny import tiny_llm_dir
    from omnistage.families.resolve import resolve_pipeline

    for arch in ("qwen2", "qwen3", "llama"):
        spec, info = resolve_pipeline(tiny_llm_dir(arch))
        assert spec.name == "llm" and info.model_type == arch
        assert [s.kind for s in spec.stages] == ["ar"] and spec.modalities == ("text",)
    deploy = resolve_deploy(spec)
    assert deploy.stage(0).max_num_seqs == 64 and deploy.stage(0).engine_args["enable_prefix_caching"] is True
