"""The paged KV cache: fixed-size blocks handed out to sequences through block tables, shared between
sequences by chained hashes of full blocks (prefix caching), evicted least-recently-used.

Paging is what lets many short sequences share one budget: a sequence holds only the blocks its tokens
fill, not a contiguous region sized for the longest possible sequence.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict

import torch

from omnistage.stages.ar.sequence import Sequence

logger = logging.getLogger(__name__)

NULL_BLOCK = 0  # never handed out; attention padding reads it, so it stays zero (no NaN from stale memory)


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


class BlockManager:
    """Allocates blocks and keeps the prefix-cache index.

    Free blocks sit in one LRU-ordered dict: unhashed blocks at the front (reused first), freed cached
    blocks at the back, so the blocks evicted first are the ones least recently used.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(1, num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of which found in the cache

    @property
    def num_total_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- admission -------------------------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> list[tuple[int, int]]:
        """(block id, hash) of the cached leading full blocks of `seq`. At least one token is left to
        compute, because that token's forward pass is what yields the next token's logits. A sequence
        that returns hidden states reuses nothing: it needs every position computed (it still shares its
        blocks)."""
        if not self.enable_prefix_caching or seq.request.hidden_layers:
            return []
        bs = self.block_size
        limit = min(seq.num_tokens - 1, seq.max_cacheable_tokens) // bs
        hits: list[tuple[int, int]] = []
        h: int | None = None
        for i in range(limit):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = hash((h, tokens))
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append((block_id, h))
        return hits

    def can_admit(self, hits: list[tuple[int, int]], num_new_tokens: int) -> bool:
        return self.blocks_to_admit(hits, num_new_tokens) <= len(self.free)

    def blocks_to_admit(self, hits: list[tuple[int, int]], num_new_tokens: int) -> int:
        """Free blocks that admitting a sequence with cached prefix `hits` and `num_new_tokens` takes."""
        fresh = self.blocks_needed(len(hits) * self.block_size + num_new_tokens) - len(hits)
        revived = sum(1 for block_id, _ in hits if self.blocks[block_id].ref_count == 0)
        return fresh + revived

    def admit(self, seq: Sequence, hits: list[tuple[int, int]]) -> None:
        """Give `seq` its cached prefix blocks; the caller then `append`s blocks for the new tokens."""
        for block_id, _ in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
        seq.block_table = [block_id for block_id, _ in hits]
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_hashed_blocks = len(hits)
        seq.last_block_hash = hits[-1][1] if hits else None
        if self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_cached_tokens

    # ---- growth ----------------------------------------------------------------------------------------
    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_to_append(seq, num_new_tokens) <= len(self.free)

    def blocks_to_append(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table))

    def append(self, seq: Sequence, num_new_tokens: int) -> None:
        needed = self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(needed):
            seq.block_table.append(self._allocate())

    def _allocate(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            if self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
            block.hash, block.token_ids = None, ()
        block.ref_count = 1
        return block_id

    def commit(self, seq: Sequence) -> None:
        """Index the blocks `seq` has completely computed, so later sequences can reuse them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens, seq.max_cacheable_tokens) // bs
        for i in range(seq.num_hashed_blocks, full):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = hash((seq.last_block_hash, tokens))
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and h not in self.hash_to_block:
                block.hash, block.token_ids = h, tokens
                self.hash_to_block[h] = block.block_id
            seq.last_block_hash, seq.num_hashed_blocks = h, i + 1

    # ---- release ---------------------------------------------------------------------------------------
    def free_seq(self, seq: Sequence) -> None:
        """Return `seq`'s blocks, tail first, so a shared prefix outlives the tails that extend it."""
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
                if block.hash is None:
                    self.free.move_to_end(block_id, last=False)
        seq.block_table = []
        seq.num_hashed_blocks, seq.last_block_hash = 0, None

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (their contents are gone, e.g. after sleep freed the cache)."""
        for block in self.blocks:
            block.hash, block.token_ids = None, ()
        self.hash_to_block.clear()

    def stats(self) -> dict[str, float]:
        return {
            "kv_blocks_total": self.num_total_blocks,
            "kv_blocks_free": self.num_free_blocks,
            "kv_usage": 1.0 - self.num_free_blocks / max(1, self.num_total_blocks),
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "prefix_cache_hit_rate": self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0,
        }


class KVStorage:
    """The cache tensors: per layer, one row of [num_kv_heads, head_dim] per slot (block * size + offset)."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        # torch.empty: pages are committed only when a block is first written.
        self.key = torch.empty(shape, dtype=dtype, device=device)
        self.value = torch.empty(shape, dtype=dtype, device=device)
        self.key[:, :block_size].zero_()
        self.value[:, :block_size].zero_()


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def available_memory(device: torch.device | str) -> int:
    """Bytes the KV cache may draw from: free device memory, or MemAvailable on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_num_blocks(
    per_token_bytes: int,
    block_size: int,
    kv_cache_bytes: int | None,
    memory_fraction: float,
    device: torch.device | str,
    max_useful_blocks: int,
) -> int:
    """Blocks to allocate (including the null block): from an explicit byte budget, else a fraction of
    free memory capped at what `max_num_seqs` sequences of the maximum length could ever use."""
    per_block = per_token_bytes * block_size
    if kv_cache_bytes is not None:
        num_blocks = kv_cache_bytes // per_block
    else:
        num_blocks = min(int(available_memory(device) * memory_fraction) // per_block, max_useful_blocks)
    if num_blocks < 2:
        from omnistage.errors import ConfigError

        raise ConfigError(
            f"kv_cache_bytes={kv_cache_bytes} holds {num_blocks} KV blocks of {per_block} bytes; "
            "the AR engine needs at least 2"
        )
    logger.info(
        "KV cache: %d blocks x %d tokens (%.1f MiB)", num_blocks, block_size, num_blocks * per_block / 2**20
    )
    return int(num_blocks)
