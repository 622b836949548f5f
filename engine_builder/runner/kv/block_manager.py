"""The KV cache manager's typed API over the block pool, per sequence (any hashable id):

    blocks = m.match_prefix(prompt)            cached full blocks that start the prompt (radix_blocks.py)
    m.allocate(seq, n_tokens, prefix=blocks)   a new sequence holding the prefix (shared, by reference)
                                               with room for n_tokens positions
    m.append(seq, n)                           room for n more positions at its end, which it now holds;
                                               a shared block about to be written is copied first
    m.fork(src, dst)                           dst maps src's blocks (n > 1, beams, speculative branches);
                                               the shared last partial block is copied when one writes it
    m.cache(seq, tokens)                       its full blocks become reusable by later prompts
    m.free(seq)                                drops its references; blocks nobody maps go back to the pool

When the pool is short, least recently used cached prefixes that no sequence maps are evicted
(RadixBlockTree.evict) before a request is refused with CapacityError. The scheduler and the runner see
block ids and token counts only; how blocks are stored is block_pool.py's business.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from engine_builder.runner.kv.block_pool import BlockPool
from engine_builder.runner.kv.radix_blocks import RadixBlockTree
from engine_builder.util.errors import InputError


class BlockManager:
    def __init__(self, pool: BlockPool, prefix_cache: bool = True) -> None:
        self.pool, self.block_size = pool, pool.block_size
        self.tree = RadixBlockTree(pool) if prefix_cache else None
        self._blocks: dict[Hashable, list[int]] = {}
        self._tokens: dict[Hashable, int] = {}

    # --- queries ------------------------------------------------------------------------------

    def blocks(self, seq: Hashable) -> list[int]:
        return self._blocks[self._check(seq)]

    def num_tokens(self, seq: Hashable) -> int:
        return self._tokens[self._check(seq)]

    def capacity(self, seq: Hashable) -> int:
        return len(self.blocks(seq)) * self.block_size

    def sequences(self) -> list[Hashable]:
        return list(self._blocks)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    def available(self) -> int:
        """Blocks an allocation could get now: free ones plus cached ones no sequence maps."""
        return self.pool.num_free + (self.tree.evictable() if self.tree is not None else 0)

    def match_prefix(self, tokens: Sequence[int]) -> list[int]:
        """Blocks of the longest cached prefix of TOKENS, leaving at least one token to compute."""
        return self.tree.match(tokens) if self.tree is not None else []

    # --- changes ------------------------------------------------------------------------------

    def allocate(self, seq: Hashable, n_tokens: int, prefix: Sequence[int] = ()) -> list[int]:
        """Start SEQ holding the cached blocks PREFIX (len(prefix) * block_size tokens) with room for
        n_tokens positions in all; its block list."""
        if seq in self._blocks:
            raise InputError(f"sequence {seq!r} already holds KV blocks; use a unique id")
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        prefix = [int(b) for b in prefix]
        self.pool.incref(prefix)  # first: eviction below must not take them
        try:
            fresh = self._take(max(0, self.blocks_for(n_tokens) - len(prefix)))
        except BaseException:
            self.pool.decref(prefix)
            raise
        self._blocks[seq] = prefix + fresh
        self._tokens[seq] = len(prefix) * self.block_size
        return self._blocks[seq]

    def reserve(self, seq: Hashable, n_tokens: int) -> list[int]:
        """Room for n_tokens positions in all (blocks added at the end); the new blocks."""
        blocks = self.blocks(seq)
        fresh = self._take(max(0, self.blocks_for(n_tokens) - len(blocks)))
        blocks += fresh
        return fresh

    def append(self, seq: Hashable, n_tokens: int) -> list[int]:
        """SEQ grows by n_tokens positions, which the caller writes next: blocks added as needed, and
        shared blocks among those written are copied first (copy-on-write). Its block list."""
        start = self.num_tokens(seq)
        self.reserve(seq, start + n_tokens)
        self.make_writable(seq, start, start + n_tokens)
        self._tokens[seq] = start + n_tokens
        return self._blocks[seq]

    def advance(self, seq: Hashable, n_tokens: int) -> None:
        """Record n_tokens more positions written into room already made writable (make_writable)."""
        end = self.num_tokens(seq) + n_tokens
        if n_tokens < 0 or end > self.capacity(seq):
            raise ValueError(f"sequence {seq!r} would hold {end} positions in room for {self.capacity(seq)}")
        self._tokens[seq] = end

    def truncate(self, seq: Hashable, n_tokens: int) -> None:
        """Forget positions n_tokens.. (their blocks stay as room; shared ones are copied before a rewrite)."""
        if not 0 <= n_tokens <= self.num_tokens(seq):
            raise ValueError(f"sequence {seq!r} holds {self.num_tokens(seq)} positions; cannot truncate to "
                             f"{n_tokens}")
        self._tokens[seq] = n_tokens

    def make_writable(self, seq: Hashable, start: int, end: int) -> list[int]:
        """Copy-on-write: blocks covering positions start..end-1 that another holder maps are replaced by
        private copies. The indices (into seq's block list) replaced."""
        blocks, changed = self.blocks(seq), []
        for j in range(start // self.block_size, min(self.blocks_for(end), len(blocks))):
            if self.pool.refcount[blocks[j]] > 1:
                (copy,) = self._take(1)
                self.pool.copy([blocks[j]], [copy])
                self.pool.decref([blocks[j]])
                blocks[j] = copy
                changed.append(j)
        return changed

    def fork(self, src: Hashable, dst: Hashable) -> list[int]:
        """A new sequence DST mapping SRC's written blocks (shared; copied on the first write into one)."""
        self.fork_many([src], [dst])
        return self._blocks[dst]

    def fork_many(self, srcs: Sequence[Hashable], dsts: Sequence[Hashable]) -> None:
        """dsts[i] becomes a fork of srcs[i]. Every src is read before any dst changes, so a dst may be a src
        (beam reordering); a dst that exists is freed first."""
        snapshots = []
        for s in srcs:
            tokens = self.num_tokens(s)
            used = self.blocks(s)[:self.blocks_for(tokens)]
            self.pool.incref(used)
            snapshots.append((list(used), tokens))
        for d in dsts:
            if d in self._blocks:
                self.free(d)
        for d, (used, tokens) in zip(dsts, snapshots):
            self._blocks[d], self._tokens[d] = used, tokens

    def free(self, seq: Hashable) -> None:
        self.pool.decref(self.blocks(seq))
        del self._blocks[seq], self._tokens[seq]

    def cache(self, seq: Hashable, tokens: Sequence[int]) -> int:
        """Make SEQ's full blocks of TOKENS (its first positions) reusable; blocks added to the tree."""
        if self.tree is None:
            return 0
        filled = min(len(tokens), self.num_tokens(seq))
        return self.tree.insert(tokens[:filled], self.blocks(seq))

    def _take(self, n: int) -> list[int]:
        if n > self.pool.num_free and self.tree is not None:
            self.tree.evict(n - self.pool.num_free)
        return self.pool.take(n)

    def _check(self, seq: Hashable) -> Hashable:
        if seq not in self._blocks:
            raise ValueError(f"sequence {seq!r} holds no KV blocks (never allocated, or freed)")
        return seq
