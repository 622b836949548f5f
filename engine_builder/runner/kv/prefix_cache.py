"""Prefix reuse across requests: a radix tree over token ids whose nodes hold the KV of one block.

A request whose prompt starts with blocks some earlier request already prefilled gets those
positions copied into its slot and prefills only the rest (SGLang's radix cache and vLLM's
prefix caching are the models). Over the static slot cache of formats/graph_io.py this is a copy
per block instead of a forward pass per token: a memcpy of `KVCacheLayout.bytes_per_token` bytes
per position, against the whole model's weights read per prefill step.

    cache = PrefixCache(kv, block_size=16, budget_bytes=256 << 20)
    n = cache.load(prompt_ids, slot)      # after kv.allocate: positions [0, n) are filled, length n
    ...prefill prompt_ids[n:] ...
    cache.store(prompt_ids, slot)         # full blocks of the prompt become reusable

Keys are token ids only: one tree belongs to one engine (its weights, dtype, KV scales), so
nothing else changes what a block holds. At least one prompt token is always left to prefill,
since its logits pick the first new token. Unreferenced leaves go first, least recently used,
when the tree would exceed its budget.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine_builder.runner.kv.kv_interface import KVCache


@dataclass(eq=False)
class _Node:
    tokens: tuple[int, ...]  # this block's ids (block_size of them); the root has none
    keys: np.ndarray | None  # [layers, kv_heads, block, head_dim]
    values: np.ndarray | None
    parent: _Node | None = None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    last_used: int = 0

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


@dataclass(frozen=True)
class PrefixCacheStats:
    blocks: int
    bytes: int
    hit_tokens: int  # prompt positions copied instead of prefilled, since the cache was made
    lookup_tokens: int  # prompt positions looked up
    evicted_blocks: int = 0  # dropped to stay within the budget, since the cache was made


class PrefixCache:
    def __init__(self, kv: KVCache, block_size: int = 16, budget_bytes: int = 256 << 20) -> None:
        if not kv.keys:
            raise ValueError("a prefix cache needs a KV cache in host memory")
        if block_size < 1 or budget_bytes < 0:
            raise ValueError(f"block_size {block_size} and budget_bytes {budget_bytes} must be positive")
        self.kv, self.block_size, self.budget_bytes = kv, block_size, budget_bytes
        self._root = _Node((), None, None)
        self._clock = itertools.count(1)
        self._bytes = 0
        self._blocks = 0
        self._hits = self._lookups = self._evicted = 0

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(self._blocks, self._bytes, self._hits, self._lookups, self._evicted)

    def _blocks_of(self, tokens: Sequence[int], limit: int) -> list[tuple[int, ...]]:
        n = limit // self.block_size
        return [tuple(tokens[i * self.block_size:(i + 1) * self.block_size]) for i in range(n)]

    def match(self, tokens: Sequence[int]) -> list[_Node]:
        """The cached blocks that start TOKENS, longest first-to-last, leaving at least one token uncached."""
        node, path = self._root, []
        for block in self._blocks_of(tokens, len(tokens) - 1):
            node = node.children.get(block)
            if node is None:
                break
            path.append(node)
        return path

    def load(self, tokens: Sequence[int], slot: int) -> int:
        """Copy the longest cached prefix of TOKENS into SLOT (empty, just allocated); its length, in tokens."""
        if self.kv.length(slot) != 0:
            raise ValueError(f"slot {slot} already holds {self.kv.length(slot)} positions")
        path = self.match(tokens)
        self._lookups += len(tokens)
        now = next(self._clock)
        for i, node in enumerate(path):
            node.last_used = now
            rows = slice(i * self.block_size, (i + 1) * self.block_size)
            for layer in range(self.kv.num_layers):  # cache rows: [slots, kv_heads, max_seq, head_dim]
                self.kv.keys[layer][slot, :, rows] = node.keys[layer]
                self.kv.values[layer][slot, :, rows] = node.values[layer]
        filled = len(path) * self.block_size
        if filled:
            self.kv.advance(slot, filled)
        self._hits += filled
        return filled

    def store(self, tokens: Sequence[int], slot: int) -> None:
        """Keep the full blocks of TOKENS, whose KV SLOT now holds, for later requests."""
        filled = min(len(tokens), self.kv.length(slot))
        node, now = self._root, next(self._clock)
        for i, block in enumerate(self._blocks_of(tokens, filled)):
            child = node.children.get(block)
            if child is None:
                rows = slice(i * self.block_size, (i + 1) * self.block_size)
                keys = np.stack([k[slot, :, rows] for k in self.kv.keys])  # [layers, kv_heads, block, head_dim]
                values = np.stack([v[slot, :, rows] for v in self.kv.values])
                if not self._make_room(keys.nbytes + values.nbytes, keep=node):
                    return
                child = _Node(block, keys, values, parent=node)
                node.children[block] = child
                self._bytes += child.nbytes
                self._blocks += 1
            child.last_used = now
            node = child

    def _make_room(self, nbytes: int, keep: _Node) -> bool:
        """Evict least recently used leaves (never KEEP or its ancestors) until NBYTES more fit the budget."""
        while self._bytes + nbytes > self.budget_bytes:
            protected = set()
            node: _Node | None = keep
            while node is not None:
                protected.add(id(node))
                node = node.parent
            leaves = [n for n in self._leaves() if id(n) not in protected]
            if not leaves:
                return False
            victim = min(leaves, key=lambda n: n.last_used)
            del victim.parent.children[victim.tokens]
            self._bytes -= victim.nbytes
            self._blocks -= 1
            self._evicted += 1
        return True

    def _leaves(self) -> list[_Node]:
        return tree_leaves(self._root)


def tree_leaves(root):
    """The childless nodes under ROOT (any node with a `children` dict: this file's tree and radix_blocks.py's)."""
    out, stack = [], list(root.children.values())
    while stack:
        node = stack.pop()
        if node.children:
            stack.extend(node.children.values())
        else:
            out.append(node)
    return out
