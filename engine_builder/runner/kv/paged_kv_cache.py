"""The paged KV cache behind the slot interface the generation loop calls (kv_cache.py's KVCacheManager).

A slot is still a batch row of the engine step, but it owns no max_seq row: it maps blocks of a shared
pool (block_manager.py), and the backend feeds the graph `block_table` [rows, max_blocks] from the
per-slot table kept here (formats/graph_io.py, paged layout). allocate / length / advance / rewind /
free keep KVCacheManager's meaning, so runner/generate.py and the executor drive it unchanged; prefix
reuse goes through PagedPrefixCache (PrefixCache's load/store), which maps cached blocks into a slot by
reference instead of copying them.

By default admission takes blocks for prompt + max_new_tokens positions (so LLM.generate never runs out
half-way, as with slots). The executor admits optimistically instead (vLLM's way, runner/scheduling/kv_growth.py):
allocate(..., initial_tokens=n) takes blocks for the first n positions only, and grow() adds blocks as
decoding proceeds, before the step that writes them; when the pool (after evicting unreferenced cached
prefixes) has none left, the scheduler preempts a running request to free its blocks. A write past a
slot's blocks grows it in prepare_write, or fails loudly (CapacityError): never lands in the scratch
block. Cached prefix blocks count once however many requests map them.

The pool is the KV budget (block_budget.py): a scheduler's kv_budget_tokens, when given, caps the blocks it hands
out (BlockPool.cap); nothing counts a budget beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine_builder.formats.graph_io import PagedKVLayout
from engine_builder.runner.kv.block_budget import BlockBudget, budget_blocks
from engine_builder.runner.kv.block_manager import BlockManager
from engine_builder.runner.kv.block_pool import SCRATCH_BLOCK, BlockPool
from engine_builder.runner.kv.kv_interface import KVCache
from engine_builder.runner.kv.prefix_cache import PrefixCacheStats
from engine_builder.util.errors import InputError


class PagedKVCacheManager(KVCache):
    sized_by_bytes = True  # --kv-cache-memory: the pool's size (the backend's resize_kv)

    def __init__(self, layout: PagedKVLayout, batch_slots: int, pool: BlockPool, prefix_cache: bool = True) -> None:
        if isinstance(batch_slots, bool) or not isinstance(batch_slots, int) or batch_slots < 1:
            raise InputError(f"KV cache batch_slots must be a positive integer, got {batch_slots!r}")
        self.layout, self.pool = layout, pool
        self.blocks = BlockManager(pool, prefix_cache)
        KVCache.__init__(self, batch_slots, layout.max_seq)
        self.num_layers = layout.num_layers
        self.block_size, self.dtype = layout.block_size, pool.dtype
        self.keys, self.values = pool.keys, pool.values  # [kv_heads, num_blocks, block_size, head_dim] per layer
        # [slots, max_blocks_per_seq]: pool block of each logical block; SCRATCH_BLOCK where none
        self.block_table = np.full((batch_slots, layout.max_blocks_per_seq), SCRATCH_BLOCK, np.int64)

    @classmethod
    def for_layout(cls, layout: PagedKVLayout, batch_slots: int, kv_cache_memory: int | None = None,
                   prefix_cache: bool = True, host_buffers: bool = True) -> PagedKVCacheManager:
        """A pool of kv_cache_memory bytes (default: a fraction of the available RAM) holding at least one
        full sequence, and at most the blocks the engine's TensorRT profile allows (max_pool_blocks).
        host_buffers=False: bookkeeping only, the backend keeps the pool on its device (trt_paged.py)."""
        pool = BlockPool.for_budget(layout, kv_cache_memory, min_blocks=layout.max_blocks_per_seq + 1,
                                    max_blocks=layout.max_pool_blocks(batch_slots), host_buffers=host_buffers)
        return cls(layout, batch_slots, pool, prefix_cache)

    @property
    def nbytes(self) -> int:
        return self.pool.nbytes

    def allocate(self, request_id: object, prompt_len: int, max_new_tokens: int,
                 initial_tokens: int | None = None) -> int:
        """Reserve a slot for prompt + max_new_tokens positions, with blocks for all of them or, given
        initial_tokens, for that many (grow() adds the rest as needed); the slot (lowest free first)."""
        slot, needed = self._admit(request_id, prompt_len, max_new_tokens)
        first = needed if initial_tokens is None else min(needed, max(1, initial_tokens))
        self.blocks.allocate(slot, first)  # CapacityError when the pool is short even after eviction
        self._take(slot, request_id, needed)
        self._sync(slot)
        return slot

    def free(self, slot: int) -> None:
        self._check_slot(slot)
        self.blocks.free(slot)
        self._release(slot)
        self._sync(slot)

    def advance(self, slot: int, num_tokens: int) -> None:
        """Record that the engine wrote num_tokens more positions into this slot."""
        new_length = self._advanced_length(slot, num_tokens)
        self.blocks.advance(slot, num_tokens)
        self.lengths[slot] = new_length

    def rewind(self, slot: int, length: int) -> None:
        """Forget positions length.. of this slot (e.g. to re-prefill a sequence)."""
        self._check_slot(slot)
        self.blocks.truncate(slot, length)
        self.lengths[slot] = length

    # --- the KV budget: the pool's blocks ----------------------------------------------------------------

    @property
    def budget(self) -> BlockBudget:
        return BlockBudget(self.block_size, self.pool.usable_blocks)

    def budget_for(self, tokens: int | None, block_tokens: int) -> BlockBudget:
        """The pool's blocks (its own block size, whatever block_tokens asks), at most `tokens`' worth."""
        blocks = self.pool.num_blocks - 1
        if tokens is not None:
            blocks = min(blocks, budget_blocks(tokens, self.block_size))
        return BlockBudget(self.block_size, blocks)

    def use_budget(self, budget: BlockBudget) -> None:
        if budget.blocks != self.pool.usable_blocks:
            self.pool.cap(budget.blocks)

    def blocks_for(self, tokens: int) -> int:
        return self.blocks.blocks_for(tokens)

    def held_blocks(self, slot: int) -> int:
        return len(self.blocks.blocks(slot))

    def blocks_to_grow(self, slot: int, n_tokens: int) -> int:
        """Blocks grow(slot, n_tokens) would take from the pool."""
        n_tokens = min(n_tokens, int(self._reserved[slot]))
        return max(0, self.blocks.blocks_for(n_tokens) - len(self.blocks.blocks(slot)))

    def available_blocks(self) -> int:
        """Blocks a growth or an allocation could take now: free ones and unreferenced cached prefixes."""
        return self.blocks.available()

    def has_blocks(self, n: int) -> bool:
        # free blocks first: counting the evictable ones walks the whole radix tree, and at batch 64 that walk,
        # once per request crossing into a new block, was a decode step's largest host cost
        return n <= self.pool.num_free or n <= self.available_blocks()

    def used_blocks(self) -> int:
        # the distinct blocks the slots' tables map (a shared prefix once; cached blocks nobody maps are free to
        # evict): read from the table, not the radix tree, which the executor's thread may be changing
        table = self.block_table
        return int(np.unique(table[table != SCRATCH_BLOCK]).size)

    def grow(self, slot: int, n_tokens: int) -> None:
        """Blocks for SLOT's first n_tokens positions (at most its reservation); CapacityError when the pool
        is short even after evicting cached prefixes nobody maps."""
        self._check_slot(slot)
        if self.blocks.reserve(slot, min(n_tokens, int(self._reserved[slot]))):
            self._sync(slot)

    def prepare_write(self, first: int, rows: int, seq: int) -> None:
        """Before a step writing seq positions at each busy slot's length in [first, first + rows): blocks
        for them (grow), and private copies of shared ones (copy-on-write), so a cached or forked block is
        never overwritten."""
        self.prepare_writes(range(first, first + rows), [seq] * rows)

    def prepare_writes(self, slots: Sequence[int], counts: Sequence[int]) -> None:
        """prepare_write for counts[i] positions at slots[i]'s length (a flat batch: runner/core/model_input.py)."""
        for slot, n in zip(slots, counts):
            slot = int(slot)
            if self._owner[slot] is None:
                continue  # idle row: its table is all scratch
            start = int(self.lengths[slot])
            end = min(start + int(n), int(self._reserved[slot]))
            if end <= start:
                continue
            grown = self.blocks.reserve(slot, end)
            if self.blocks.make_writable(slot, start, end) or grown:
                self._sync(slot)

    def rows_fit_one_call(self, starts: dict[int, int], width: int) -> bool:
        # one attention op whatever the rows (Attention-24 in the twin: no branch on batch or past lengths), so
        # rows may start anywhere (a prefix-cache hit); a rider must be a free slot, whose table is all scratch
        # (an admitted one would take blocks for the junk it writes, prepare_writes)
        lo, hi = min(starts), max(starts) + 1
        riders_free = all(self.is_free(s) for s in range(lo, hi) if s not in starts)
        return riders_free and max(starts.values()) + width <= self.max_seq

    def prefix_cache(self, budget_bytes: int | None = None, block_size: int | None = None) -> PagedPrefixCache | None:
        """Cached blocks mapped by reference (the pool evicts unreferenced ones when short, so no byte budget of
        its own; the block size is the pool's)."""
        return PagedPrefixCache(self) if self.blocks.tree is not None else None

    def capacity_words(self) -> str:
        return f"the block pool holds {self.pool.num_blocks} blocks"

    def copy_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Each dst slot (allocated) becomes a fork of its src slot: beam fan-out and reordering, by reference."""
        src, dst = [int(s) for s in src], [int(d) for d in dst]
        for s in (*src, *dst):
            self._check_slot(s)
        lengths = [int(self.lengths[s]) for s in src]
        self.blocks.fork_many(src, dst)
        for d, n in zip(dst, lengths):
            self.blocks.reserve(d, int(self._reserved[d]))
            self.lengths[d] = n
            self._sync(d)

    # --- prefix reuse (PagedPrefixCache) ------------------------------------------------------------

    def load_prefix(self, tokens: Sequence[int], slot: int) -> int:
        """Map the longest cached prefix of TOKENS into SLOT (just allocated, empty); its length in tokens."""
        if self.length(slot) != 0:
            raise ValueError(f"slot {slot} already holds {self.length(slot)} positions")
        cached = self.blocks.match_prefix(tokens)
        if not cached:
            return 0
        # the fresh blocks admission took for those positions go back: the cached ones replace them
        room = self.blocks.capacity(slot)
        self.blocks.free(slot)
        self.blocks.allocate(slot, room, prefix=cached)
        filled = len(cached) * self.block_size
        self.lengths[slot] = filled
        self._sync(slot)
        return filled

    def store_prefix(self, tokens: Sequence[int], slot: int) -> int:
        return self.blocks.cache(slot, tokens[:self.length(slot)])

    def _sync(self, slot: int) -> None:
        row = self.blocks.blocks(slot) if self._owner[slot] is not None else []
        self.block_table[slot, :len(row)] = row
        self.block_table[slot, len(row):] = SCRATCH_BLOCK


class PagedPrefixCache:
    """PrefixCache's interface (load / store / stats) over a PagedKVCacheManager's radix tree: a hit maps
    cached blocks into the request's table by reference instead of copying their KV into its slot."""

    def __init__(self, kv: PagedKVCacheManager) -> None:
        if kv.blocks.tree is None:
            raise ValueError("this paged KV cache was made without a prefix cache")
        self.kv, self.block_size = kv, kv.block_size

    def load(self, tokens: Sequence[int], slot: int) -> int:
        return self.kv.load_prefix(tokens, slot)

    def store(self, tokens: Sequence[int], slot: int) -> None:
        self.kv.store_prefix(tokens, slot)

    def stats(self) -> PrefixCacheStats:
        s = self.kv.blocks.tree.stats()
        return PrefixCacheStats(s.blocks, s.blocks * self.kv.layout.bytes_per_block, s.hit_tokens, s.lookup_tokens,
                                s.evicted_blocks)
