"""Prefix reuse over the slot layout: the radix tree (radix_tree.py) whose nodes hold a copy of one block's KV.

A request whose prompt starts with blocks some earlier request already prefilled gets those
positions copied into its slot and prefills only the rest (SGLang's radix cache and vLLM's
prefix caching are the models). Over the static slot cache of formats/graph_io.py this is a copy
per block instead of a forward pass per token: a memcpy of `KVCacheLayout.bytes_per_token` bytes
per position, against the whole model's weights read per prefill step.

    cache = PrefixCache(kv, block_size=16, budget_bytes=256 << 20)
    n = cache.load(prompt_ids, slot)      # after kv.allocate: positions [0, n) are filled, length n
    ...prefill prompt_ids[n:] ...
    cache.store(prompt_ids, slot)         # full blocks of the prompt become reusable

At least one prompt token is always left to prefill, since its logits pick the first new token.
Leaves go first, least recently used, when the tree would exceed its budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine_builder.runner.kv.kv_interface import KVCache
from engine_builder.runner.kv.radix_tree import RadixNode, RadixTree
from engine_builder.runner.tunables import PREFIX_CACHE_BYTES


@dataclass(frozen=True)
class BlockCopy:
    """One cached block's KV, copied out of a slot."""

    keys: np.ndarray  # [layers, kv_heads, block, head_dim]
    values: np.ndarray

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


@dataclass(frozen=True)
class PrefixCacheStats:
    blocks: int
    bytes: int
    hit_tokens: int  # prompt positions copied instead of prefilled, since the cache was made
    lookup_tokens: int  # prompt positions looked up
    evicted_blocks: int = 0  # dropped to stay within the budget, since the cache was made


class PrefixCache:
    def __init__(self, kv: KVCache, block_size: int = 16, budget_bytes: int = PREFIX_CACHE_BYTES) -> None:
        if not kv.keys:
            raise ValueError("a prefix cache needs a KV cache in host memory")
        if block_size < 1 or budget_bytes < 0:
            raise ValueError(f"block_size {block_size} and budget_bytes {budget_bytes} must be positive")
        self.kv, self.block_size, self.budget_bytes = kv, block_size, budget_bytes
        self.tree: RadixTree[BlockCopy] = RadixTree(block_size)
        self._bytes = 0

    def stats(self) -> PrefixCacheStats:
        t = self.tree
        return PrefixCacheStats(t.nodes, self._bytes, t.hit_tokens, t.lookup_tokens, t.evicted)

    def load(self, tokens: Sequence[int], slot: int) -> int:
        """Copy the longest cached prefix of TOKENS into SLOT (empty, just allocated); its length, in tokens."""
        if self.kv.length(slot) != 0:
            raise ValueError(f"slot {slot} already holds {self.kv.length(slot)} positions")
        path = self.tree.match(tokens)
        for i, node in enumerate(path):
            rows = slice(i * self.block_size, (i + 1) * self.block_size)
            for layer in range(self.kv.num_layers):  # cache rows: [slots, kv_heads, max_seq, head_dim]
                self.kv.keys[layer][slot, :, rows] = node.payload.keys[layer]
                self.kv.values[layer][slot, :, rows] = node.payload.values[layer]
        filled = len(path) * self.block_size
        if filled:
            self.kv.advance(slot, filled)
        return filled

    def store(self, tokens: Sequence[int], slot: int) -> None:
        """Keep the full blocks of TOKENS, whose KV SLOT now holds, for later requests."""

        def copy(i: int, parent: RadixNode[BlockCopy]) -> BlockCopy | None:
            rows = slice(i * self.block_size, (i + 1) * self.block_size)
            block = BlockCopy(np.stack([k[slot, :, rows] for k in self.kv.keys]),
                              np.stack([v[slot, :, rows] for v in self.kv.values]))
            if not self._make_room(block.nbytes, keep=parent):
                return None
            self._bytes += block.nbytes
            return block

        self.tree.insert(tokens, min(len(tokens), self.kv.length(slot)), copy)

    def _make_room(self, nbytes: int, keep: RadixNode[BlockCopy]) -> bool:
        """Evict least recently used leaves (never KEEP or its ancestors) until NBYTES more fit the budget."""
        protected = set()
        node: RadixNode[BlockCopy] | None = keep
        while node is not None:
            protected.add(id(node))
            node = node.parent

        def gone(leaf: RadixNode[BlockCopy]) -> None:
            self._bytes -= leaf.payload.nbytes

        self.tree.evict(lambda: self._bytes + nbytes <= self.budget_bytes, lambda n: id(n) not in protected, gone)
        return self._bytes + nbytes <= self.budget_bytes
