"""The one radix tree of prefix reuse: token ids in blocks, each node one full block and what holds its KV.

Both storages reuse prefixes through it (SGLang's radix_cache.py is the model); they differ only in what a node
holds and when one may go:

    paged layout   radix_blocks.RadixBlockTree: a node holds a pool block id (shared by reference, never copied);
                   a leaf may go when only the tree references its block
    slot layout    prefix_cache.PrefixCache: a node holds a copy of the block's keys and values (copied into a
                   slot on a hit); a leaf may go when it is not on the path being stored, to stay within bytes

Keys are token ids only: a tree belongs to one engine (weights, dtype, int8 KV scales fixed), so nothing else
changes what a block holds. Eviction takes the least recently used (matched or inserted) leaf first; a parent
whose last child went becomes a leaf in turn.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Payload = TypeVar("Payload")


@dataclass(eq=False)
class RadixNode(Generic[Payload]):
    tokens: tuple[int, ...]  # this block's ids (block_size of them); the root has none
    payload: Payload | None  # what holds the block's KV (None at the root)
    parent: RadixNode[Payload] | None = None
    children: dict[tuple[int, ...], RadixNode[Payload]] = field(default_factory=dict)
    last_used: int = 0


class RadixTree(Generic[Payload]):
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.root: RadixNode[Payload] = RadixNode((), None)
        self._clock = itertools.count(1)
        self.nodes = self.hit_tokens = self.lookup_tokens = self.evicted = 0

    def chunks(self, tokens: Sequence[int], limit: int) -> list[tuple[int, ...]]:
        """The full blocks of tokens[:limit]."""
        size = self.block_size
        return [tuple(tokens[i * size:(i + 1) * size]) for i in range(limit // size)]

    def match(self, tokens: Sequence[int], leave: int = 1) -> list[RadixNode[Payload]]:
        """The nodes of the longest cached prefix of TOKENS that leaves at least LEAVE tokens uncached (a prompt's
        last token must run: its logits pick the first new token), root first; marked used now and counted."""
        node, path, now = self.root, [], next(self._clock)
        for chunk in self.chunks(tokens, len(tokens) - leave):
            node = node.children.get(chunk)
            if node is None:
                break
            node.last_used = now
            path.append(node)
        self.lookup_tokens += len(tokens)
        self.hit_tokens += len(path) * self.block_size
        return path

    def insert(self, tokens: Sequence[int], limit: int,
               payload_of: Callable[[int, RadixNode[Payload]], Payload | None]) -> int:
        """Cache the full blocks of tokens[:limit]: a block already cached under the same path stays, a new one
        takes payload_of(block index, parent node), or ends the insert where that gives None. Returns how many
        nodes were added."""
        node, now, added = self.root, next(self._clock), 0
        for i, chunk in enumerate(self.chunks(tokens, limit)):
            child = node.children.get(chunk)
            if child is None:
                payload = payload_of(i, node)
                if payload is None:
                    break
                child = node.children[chunk] = RadixNode(chunk, payload, node)
                self.nodes += 1
                added += 1
            child.last_used = now
            node = child
        return added

    def leaves(self) -> list[RadixNode[Payload]]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                out.append(node)
        return out

    def evict(self, done: Callable[[], bool], may_go: Callable[[RadixNode[Payload]], bool],
              gone: Callable[[RadixNode[Payload]], None]) -> int:
        """Remove least recently used leaves that may_go, calling gone(node) for each, until done() or none is
        left. Returns how many went."""
        heap = [(leaf.last_used, id(leaf), leaf) for leaf in self.leaves() if may_go(leaf)]
        heapq.heapify(heap)
        went = 0
        while heap and not done():
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens]
            gone(leaf)
            self.nodes -= 1
            self.evicted += 1
            went += 1
            if parent is not self.root and not parent.children and may_go(parent):
                heapq.heappush(heap, (parent.last_used, id(parent), parent))
        return went

    def walk(self) -> list[tuple[RadixNode[Payload], tuple[RadixNode[Payload], ...]]]:
        """Every node with its path from the root (itself last)."""
        out, stack = [], [(child, (child,)) for child in self.root.children.values()]
        while stack:
            node, path = stack.pop()
            out.append((node, path))
            stack.extend((c, (*path, c)) for c in node.children.values())
        return out

    def clear(self) -> list[RadixNode[Payload]]:
        """Drop every node; returns them (their payloads are the caller's to release)."""
        dropped = [node for node, _ in self.walk()]
        self.root.children.clear()
        self.nodes = 0
        return dropped
