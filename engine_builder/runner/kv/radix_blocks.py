"""Prefix reuse over the block pool: the radix tree (radix_tree.py) whose nodes hold pool block ids.

Each node is one full block: its block_size token ids (the edge from its parent) and the pool block that
holds their KV, given the whole path above it. The tree holds one reference per node's block
(block_pool.py), so a block lives as long as the tree or a sequence maps it, and a new request whose prompt
starts with a cached path maps the same blocks into its table: shared by reference, never copied
(SGLang's radix_cache.py and vLLM's block_pool.py are the models). When the pool runs short, leaves whose
block only the tree references go first, least recently used first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine_builder.runner.kv.block_pool import BlockPool
from engine_builder.runner.kv.radix_tree import RadixNode, RadixTree


@dataclass(frozen=True)
class RadixStats:
    blocks: int  # nodes (one block each) in the tree
    hit_tokens: int  # positions matched by match_prefix, since the tree was made
    lookup_tokens: int  # positions looked up
    evicted_blocks: int


class RadixBlockTree:
    def __init__(self, pool: BlockPool) -> None:
        self.pool, self.block_size = pool, pool.block_size
        self.tree: RadixTree[int] = RadixTree(pool.block_size)

    def stats(self) -> RadixStats:
        t = self.tree
        return RadixStats(t.nodes, t.hit_tokens, t.lookup_tokens, t.evicted)

    def match(self, tokens: Sequence[int], leave: int = 1) -> list[int]:
        """Blocks of the longest cached prefix of TOKENS that leaves at least LEAVE tokens uncached. Marks them
        used now."""
        return [node.payload for node in self.tree.match(tokens, leave)]

    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> int:
        """Cache the full blocks of TOKENS, whose KV BLOCKS[j] holds (block j = tokens j*B .. j*B + B - 1).
        A block already cached under the same path stays (the caller keeps its own copy); new nodes take a
        reference. Returns how many blocks were added."""

        def take(i: int, parent: RadixNode[int]) -> int:
            self.pool.incref([blocks[i]])
            return int(blocks[i])

        return self.tree.insert(tokens, min(len(tokens), len(blocks) * self.block_size), take)

    def evictable(self) -> int:
        """Blocks eviction could free now: nodes whose block only the tree holds and whose subtree holds
        only such nodes."""
        def count(node: RadixNode[int]) -> tuple[int, bool]:
            total, all_free = 0, True
            for child in node.children.values():
                n, free = count(child)
                total, all_free = total + n, all_free and free
            if node is self.tree.root:
                return total, all_free
            mine = all_free and self.pool.refcount[node.payload] == 1
            return total + (1 if mine else 0), mine
        return count(self.tree.root)[0]

    def evict(self, n_blocks: int) -> int:
        """Free up to N_BLOCKS blocks: least recently used unreferenced leaves first. Returns how many."""
        freed = 0

        def gone(leaf: RadixNode[int]) -> None:
            nonlocal freed
            self.pool.decref([leaf.payload])
            freed += 1

        return self.tree.evict(lambda: freed >= n_blocks, self._free_leaf, gone)

    def clear(self) -> None:
        """Drop every node and the tree's references (blocks sequences still map stay theirs)."""
        for node in self.tree.clear():
            self.pool.decref([node.payload])

    def _free_leaf(self, node: RadixNode[int]) -> bool:
        return not node.children and self.pool.refcount[node.payload] == 1

    def cached_paths(self) -> list[tuple[int, ...]]:
        """Every node's block ids from the root, for tests and /metrics-style inspection."""
        return [tuple(n.payload for n in path) for _, path in self.tree.walk()]
