"""The one KV budget, kept by the KV cache and asked through its interface (issue 32): a slot engine's pool of counts
only, a paged engine's block pool capped by kv_budget_tokens."""

from __future__ import annotations

import pytest

from engine_builder.formats.graph_io import PagedKVLayout
from engine_builder.runner.kv.block_pool import BlockPool
from engine_builder.runner.kv.kv_cache import KVCacheManager
from engine_builder.runner.kv.paged_kv_cache import PagedKVCacheManager
from engine_builder.util.errors import CapacityError, ConfigError

LAYOUT = PagedKVLayout(num_layers=1, kv_heads=1, block_size=4, head_dim=2, dtype="float32", max_seq=64)


def slot_kv(slots: int = 4, max_seq: int = 100) -> KVCacheManager:
    return KVCacheManager(1, slots, 1, max_seq, 2, "float32", host_buffers=False)


def test_a_slot_cache_without_a_budget_holds_every_slot_whole():
    """A caller with no scheduler (a draft model's cache, eval's scoring) reserves whole rows: never refused,
    even where max_seq is no multiple of the block (slots x max_seq // 16 would hold 25 blocks, not 4 x 7)."""
    kv = slot_kv()
    assert kv.budget.block_tokens == 16 and kv.budget.blocks == 4 * 7
    slots = [kv.allocate(i, 1, 99) for i in range(4)]
    assert [kv.held_blocks(s) for s in slots] == [7] * 4 and kv.available_blocks() == 0
    assert kv.blocks_to_write(slots[0], 100) == 0  # the row is whole: a write never needs budget blocks


def test_a_slot_cache_counts_the_schedulers_budget_in_blocks():
    kv = slot_kv()
    assert kv.budget_for(None, 16).blocks == 4 * 100 // 16  # default: every slot's max_seq_len
    with pytest.raises(ConfigError, match="holds no block of 16 tokens"):
        kv.budget_for(15, 16)
    kv.use_budget(kv.budget_for(10 * 16, 16))
    a = kv.allocate("a", 20, 60, initial_tokens=21)  # optimistic: its context and next token, 2 blocks
    assert (kv.held_blocks(a), kv.available_blocks(), kv.used_blocks()) == (2, 8, 2)
    assert kv.blocks_to_grow(a, 33) == 1 and kv.blocks_to_grow(a, 500) == 5 - 2  # at most its reservation
    kv.grow(a, 33)
    assert (kv.held_blocks(a), kv.available_blocks()) == (3, 7)
    b = kv.allocate("b", 40, 60)  # whole: 100 positions, 7 blocks
    assert kv.available_blocks() == 0 and not kv.has_blocks(1) and not kv.admits(1, 0.0)
    with pytest.raises(CapacityError, match="the KV budget needs 1 free blocks but has 0 of 10"):
        kv.grow(a, 49)
    with pytest.raises(CapacityError, match="KV budget"):
        kv.allocate("c", 1, 1)
    assert kv.slot_of("c") is None and kv.num_free == 2  # refused before it took a slot
    kv.free(b)
    assert (kv.available_blocks(), kv.used_blocks()) == (7, 3)
    kv.free(a)
    assert kv.used_blocks() == 0 and kv.available_blocks() == 10


def test_a_paged_pool_is_the_budget_capped_by_kv_budget_tokens():
    kv = PagedKVCacheManager(LAYOUT, 4, BlockPool(LAYOUT, 30, host_buffers=False), prefix_cache=True)
    assert kv.budget_for(None, 16).blocks == 29 == kv.budget.blocks  # every block but the scratch one
    assert kv.budget_for(10_000, 16).blocks == 29  # a budget can only lower what the pool holds
    with pytest.raises(ConfigError, match="holds no block of 4 tokens"):
        kv.budget_for(3, 16)
    capped = kv.budget_for(10 * 4 + 3, 16)  # in the pool's blocks of 4, whatever the scheduler counts in
    assert (capped.block_tokens, capped.blocks) == (4, 10)
    kv.use_budget(capped)
    assert kv.budget == capped and kv.available_blocks() == 10 and kv.pool.num_free == 10
    a = kv.allocate("a", 8, 30, initial_tokens=9)  # 3 blocks
    kv.advance(a, 8)
    kv.store_prefix(list(range(8)), a)  # two full blocks cached, mapped by a too
    b = kv.allocate("b", 9, 30, initial_tokens=10)
    assert kv.load_prefix([*range(8), 99], b) == 8  # maps the two cached blocks: shared, counted once
    assert kv.used_blocks() == 3 + 1 and kv.available_blocks() == 10 - 4
    assert not kv.has_blocks(7)
    with pytest.raises(CapacityError, match="--kv-budget-tokens"):
        kv.grow(a, 38)  # 10 blocks for a alone: 7 more, 6 within the cap
    kv.free(a)
    kv.free(b)
    assert kv.used_blocks() == 0 and kv.available_blocks() == 10  # the cached prefix is evictable
    kv.use_budget(kv.budget_for(None, 16))  # a scheduler without a budget: the whole pool again
    assert kv.budget.blocks == 29 and kv.pool.num_free + kv.blocks.tree.evictable() == 29
