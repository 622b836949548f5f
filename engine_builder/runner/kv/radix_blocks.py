"""Prefix reuse over the block pool: a radix tree keyed by token ids whose nodes hold block ids.

Each node is one full block: its block_size token ids (the edge from its parent) and the pool block that
holds their KV, given the whole path above it. The tree holds one reference per node's block
(block_pool.py), so a block lives as long as the tree or a sequence maps it, and a new request whose prompt
starts with a cached path maps the same blocks into its table: shared by reference, never copied
(SGLang's radix_cache.py and vLLM's block_pool.py are the models).

Keys are token ids only: a tree belongs to one engine (weights, dtype, int8 KV scales fixed), so nothing
else changes what a block holds. When the pool runs short, leaves whose block only the tree references
go first, least recently used (matched or inserted) first; a parent whose last child went becomes a leaf
in turn.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine_builder.runner.kv.block_pool import BlockPool
from engine_builder.runner.kv.prefix_cache import tree_leaves


@dataclass(eq=False)
class _Node:
    tokens: tuple[int, ...]  # the block's token ids; the root has none
    block: int  # pool block id (-1 at the root)
    parent: _Node | None = None
    children: dict[tuple[int, ...], _Node] = field(default_factory=dict)
    last_used: int = 0


@dataclass(frozen=True)
class RadixStats:
    blocks: int  # nodes (one block each) in the tree
    hit_tokens: int  # positions matched by match_prefix, since the tree was made
    lookup_tokens: int  # positions looked up
    evicted_blocks: int


class RadixBlockTree:
    def __init__(self, pool: BlockPool) -> None:
        self.pool, self.block_size = pool, pool.block_size
        self._root = _Node((), -1)
        self._clock = itertools.count(1)
        self._nodes = 0
        self._hits = self._lookups = self._evicted = 0

    def stats(self) -> RadixStats:
        return RadixStats(self._nodes, self._hits, self._lookups, self._evicted)

    def _chunks(self, tokens: Sequence[int], limit: int) -> list[tuple[int, ...]]:
        size = self.block_size
        return [tuple(tokens[i * size:(i + 1) * size]) for i in range(limit // size)]

    def match(self, tokens: Sequence[int], leave: int = 1) -> list[int]:
        """Blocks of the longest cached prefix of TOKENS that leaves at least LEAVE tokens uncached (a
        prompt's last token must run: its logits pick the first new token). Marks them used now."""
        node, blocks, now = self._root, [], next(self._clock)
        for chunk in self._chunks(tokens, len(tokens) - leave):
            node = node.children.get(chunk)
            if node is None:
                break
            node.last_used = now
            blocks.append(node.block)
        self._lookups += len(tokens)
        self._hits += len(blocks) * self.block_size
        return blocks

    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> int:
        """Cache the full blocks of TOKENS, whose KV BLOCKS[j] holds (block j = tokens j*B .. j*B + B - 1).
        A block already cached under the same path stays (the caller keeps its own copy); new nodes take a
        reference. Returns how many blocks were added."""
        node, now, added = self._root, next(self._clock), 0
        for chunk, block in zip(self._chunks(tokens, len(tokens)), blocks):
            child = node.children.get(chunk)
            if child is None:
                self.pool.incref([block])
                child = node.children[chunk] = _Node(chunk, int(block), node)
                self._nodes += 1
                added += 1
            child.last_used = now
            node = child
        return added

    def evictable(self) -> int:
        """Blocks eviction could free now: nodes whose block only the tree holds and whose subtree holds
        only such nodes."""
        def count(node: _Node) -> tuple[int, bool]:
            total, all_free = 0, True
            for child in node.children.values():
                n, free = count(child)
                total, all_free = total + n, all_free and free
            if node is self._root:
                return total, all_free
            mine = all_free and self.pool.refcount[node.block] == 1
            return total + (1 if mine else 0), mine
        return count(self._root)[0]

    def evict(self, n_blocks: int) -> int:
        """Free up to N_BLOCKS blocks: least recently used unreferenced leaves first. Returns how many."""
        heap = [(leaf.last_used, id(leaf), leaf) for leaf in self._leaves() if self._free_leaf(leaf)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < n_blocks:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.tokens]
            self.pool.decref([leaf.block])
            self._nodes -= 1
            self._evicted += 1
            freed += 1
            if parent is not self._root and not parent.children and self._free_leaf(parent):
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        return freed

    def clear(self) -> None:
        """Drop every node and the tree's references (blocks sequences still map stay theirs)."""
        stack = list(self._root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            self.pool.decref([node.block])
        self._root.children.clear()
        self._nodes = 0

    def _free_leaf(self, node: _Node) -> bool:
        return not node.children and self.pool.refcount[node.block] == 1

    def _leaves(self) -> list[_Node]:
        return tree_leaves(self._root)

    def cached_paths(self) -> list[tuple[int, ...]]:
        """Every node's block ids from the root, for tests and /metrics-style inspection."""
        out, stack = [], [(child, (child.block,)) for child in self._root.children.values()]
        while stack:
            node, path = stack.pop()
            out.append(path)
            stack.extend((c, (*path, c.block)) for c in node.children.values())
        return out
