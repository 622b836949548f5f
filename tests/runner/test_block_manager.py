"""The paged KV cache's block storage (runner/kv/block_pool.py, radix_blocks.py, block_manager.py) on real pools.

Block contents are checked, not just counts: every append writes each position's token id into the pool
(as the engine would write its keys), and every sequence must read back exactly its own tokens, so a
shared block that was written instead of copied, or a block freed while mapped, shows.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_builder.formats.graph_io import PagedKVLayout
from engine_builder.runner.kv.block_manager import BlockManager
from engine_builder.runner.kv.block_pool import SCRATCH_BLOCK, BlockPool
from engine_builder.util.errors import CapacityError

B = 4
LAYOUT = PagedKVLayout(num_layers=2, kv_heads=1, block_size=B, head_dim=2, dtype="float32", max_seq=64)


def manager(blocks: int = 32, prefix_cache: bool = True) -> BlockManager:
    return BlockManager(BlockPool(LAYOUT, blocks), prefix_cache)


def write(m: BlockManager, seq, tokens: list[int]) -> None:
    """Append TOKENS to SEQ, storing each token id at its position in every layer's keys and values."""
    start = m.num_tokens(seq)
    blocks = m.append(seq, len(tokens))
    for i, t in enumerate(tokens, start):
        for pool in (*m.pool.keys, *m.pool.values):
            pool[:, blocks[i // B], i % B] = t  # head-major pool [kv_heads, num_blocks, B, head_dim]


def read(m: BlockManager, seq) -> list[int]:
    blocks, n = m.blocks(seq), m.num_tokens(seq)
    out = [int(m.pool.keys[0][0, blocks[i // B], i % B, 0]) for i in range(n)]
    for pool in (*m.pool.keys, *m.pool.values):  # every layer agrees
        assert [int(pool[0, blocks[i // B], i % B, 1]) for i in range(n)] == out
    return out


def check_accounting(m: BlockManager) -> None:
    """Every block's count = the sequences and tree nodes mapping it; free blocks are exactly those at 0."""
    want = np.zeros(m.pool.num_blocks, np.int64)
    want[SCRATCH_BLOCK] = 1
    for seq in m.sequences():
        np.add.at(want, m.blocks(seq), 1)
    if m.tree is not None:
        np.add.at(want, [path[-1] for path in m.tree.cached_paths()], 1)
    np.testing.assert_array_equal(m.pool.refcount, want)
    assert sorted(m.pool._free) == sorted(np.flatnonzero(want == 0).tolist())


def test_prefix_hit_shares_blocks_and_miss_takes_none():
    m = manager()
    prompt = list(range(100, 110))  # 10 tokens: 2 full blocks + 2
    m.allocate("a", 0)
    write(m, "a", prompt)
    assert m.cache("a", prompt) == 2
    hit = m.match_prefix([*prompt[:8], 7, 7, 7])
    assert hit == m.blocks("a")[:2]  # the same block ids: shared, not copied
    m.allocate("b", 12, prefix=hit)
    assert m.num_tokens("b") == 8 and m.blocks("b")[:2] == hit
    write(m, "b", [7, 7, 7])
    assert read(m, "b") == [*prompt[:8], 7, 7, 7] and read(m, "a") == prompt
    assert m.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9]) == []  # miss
    assert m.match_prefix(prompt[:8]) == hit[:1]  # at least one token is left to compute
    check_accounting(m)
    stats = m.tree.stats()
    assert (stats.blocks, stats.hit_tokens) == (2, 12)


def test_fork_copies_the_shared_partial_block_on_write():
    m = manager()
    m.allocate("a", 0)
    write(m, "a", [1, 2, 3, 4, 5, 6])
    m.fork("a", "b")
    assert m.blocks("b") == m.blocks("a")
    write(m, "b", [9])
    write(m, "a", [8])
    assert read(m, "a") == [1, 2, 3, 4, 5, 6, 8] and read(m, "b") == [1, 2, 3, 4, 5, 6, 9]
    assert m.blocks("b")[0] == m.blocks("a")[0] and m.blocks("b")[1] != m.blocks("a")[1]
    check_accounting(m)
    m.free("a")
    m.free("b")
    assert m.pool.num_free == m.pool.num_blocks - 1


def test_lru_eviction_takes_unreferenced_leaves_oldest_first():
    m = manager(blocks=1 + 7)
    chains = {}
    for name, first in (("x", 10), ("y", 20), ("z", 30)):
        tokens = list(range(first, first + 2 * B))  # two blocks each: a root child and its leaf
        m.allocate(name, 0)
        write(m, name, tokens)
        m.cache(name, tokens)
        chains[name] = (tokens, m.blocks(name)[:2])
        m.free(name)
    assert m.pool.num_free == 1
    m.match_prefix([*chains["x"][0], 0])  # x used last; y is now the oldest, then z
    m.allocate("busy", 0, prefix=m.match_prefix([*chains["z"][0][:B], 0]))  # z's first block is mapped
    m.allocate("new", 3 * B)  # needs 3 blocks: 1 free + 2 evicted
    left = {tuple(path) for path in m.tree.cached_paths()}
    y, z, x = chains["y"][1], chains["z"][1], chains["x"][1]
    assert (y[0],) not in left and (y[0], y[1]) not in left  # y's leaf, then y's root block
    assert (z[0],) in left and (x[0], x[1]) in left and (z[0], z[1]) in left
    m.allocate("more", B)  # z's leaf goes next (z's root block is mapped by "busy")
    left = {tuple(path) for path in m.tree.cached_paths()}
    assert (z[0], z[1]) not in left and (z[0],) in left and (x[0], x[1]) in left
    with pytest.raises(CapacityError, match="free blocks"):
        m.allocate("too much", 3 * B)
    check_accounting(m)


def test_pool_budget():
    pool = BlockPool.for_budget(LAYOUT, 10 * LAYOUT.bytes_per_block + 5)
    assert pool.num_blocks == 10 and pool.keys[0].shape == (1, 10, B, 2)
    with pytest.raises(CapacityError, match="kv_cache_memory"):
        BlockPool.for_budget(LAYOUT, LAYOUT.bytes_per_block, min_blocks=3)


OPS = st.lists(st.tuples(st.sampled_from(["allocate", "append", "fork", "free", "cancel", "cache"]),
                         st.integers(0, 7), st.integers(1, 9)), min_size=1000, max_size=1000)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(OPS)
def test_random_operations_leak_no_block(ops):
    """1,000 random allocate / append / fork / free / cancel (free mid-prefill) / cache operations over a pool
    that runs short: counts always match the mappings, every sequence reads back its own tokens, and once
    everything is freed and the tree cleared every block is free again."""
    m = manager(blocks=40)
    expected: dict[int, list[int]] = {}
    rng = np.random.default_rng(0)
    for op, seq, n in ops:
        try:
            if op == "allocate" and seq not in expected:
                prompt = rng.integers(0, 3, n + 4).tolist()  # a tiny vocab: prefixes repeat
                cached = m.match_prefix(prompt)
                m.allocate(seq, len(prompt), prefix=cached)
                expected[seq] = prompt[:len(cached) * B]
                write(m, seq, prompt[len(cached) * B:])
                expected[seq] = prompt
            elif op == "append" and seq in expected:
                tokens = rng.integers(0, 3, n).tolist()
                write(m, seq, tokens)
                expected[seq] += tokens
            elif op == "fork" and seq in expected:
                dst = (seq + n) % 8
                if dst != seq:
                    m.fork_many([seq], [dst])
                    expected[dst] = list(expected[seq])
            elif op in ("free", "cancel") and seq in expected:
                if op == "free":
                    m.cache(seq, expected[seq])
                m.free(seq)
                del expected[seq]
            elif op == "cache" and seq in expected:
                m.cache(seq, expected[seq])
        except CapacityError:
            if op == "allocate":
                assert seq not in m.sequences()
                expected.pop(seq, None)
            else:  # append: the sequence keeps what it had; drop it as a scheduler would preempt it
                m.free(seq)
                del expected[seq]
        for s, tokens in expected.items():
            assert read(m, s) == tokens
        check_accounting(m)
    for s in list(expected):
        m.free(s)
    m.tree.clear()
    assert m.pool.num_free == m.pool.num_blocks - 1
    assert m.pool.refcount[1:].sum() == 0


def test_has_blocks_answers_as_available_blocks_does():
    """has_blocks(n) asks the free blocks first and walks the radix tree only when they are short: the same answer
    as n <= available_blocks() with free, mapped and cached-but-evictable blocks in the pool."""
    from engine_builder.runner.kv.paged_kv_cache import PagedKVCacheManager

    kv = PagedKVCacheManager(LAYOUT, 4, BlockPool(LAYOUT, 1 + 12), prefix_cache=True)
    for i, first in enumerate((10, 20, 30)):  # three cached chains of 2 blocks, two of them unmapped afterwards
        tokens = list(range(first, first + 2 * B))
        slot = kv.allocate(i, len(tokens), 1)
        kv.advance(slot, len(tokens))
        assert kv.store_prefix(tokens, slot) == 2
        if i < 2:
            kv.free(slot)
    assert kv.pool.num_free < kv.available_blocks()  # the evictable blocks count
    for n in range(kv.pool.num_blocks + 2):
        assert kv.has_blocks(n) == (n <= kv.available_blocks()), n
