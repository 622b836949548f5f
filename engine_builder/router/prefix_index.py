"""An approximate radix tree of recent prompts per backend, for the prefix-aware policy.

SGLang's cache-aware router keeps a radix tree of the text each worker has recently served and sends
a request to the worker whose tree matches the longest prefix of its prompt. This index is the same
tree cut at fixed BLOCK_CHARS-character boundaries and stored by the hash of each prefix (block i's key
hashes blocks 0..i, as vLLM keys its KV blocks): a trie edge per block, so looking a prompt up is one
dict probe per block and no tree walking. "Approximate" twice over, as SGLang's: matches are counted
in whole blocks of text (the replica's own cache counts whole 16-token blocks), and what a replica has
evicted from its KV cache is only guessed, by keeping each backend's BLOCKS_PER_BACKEND most recently
used blocks.

    index = PrefixIndex()
    keys = index.keys("system prompt ... user question")
    index.matched_blocks(backend, keys)   # leading blocks that backend has seen recently
    index.insert(backend, keys)
"""

from __future__ import annotations

from collections import OrderedDict

BLOCK_CHARS = 32
BLOCKS_PER_BACKEND = 1 << 16  # 2 M characters of prompts remembered per backend


class PrefixIndex:
    def __init__(self, block_chars: int = BLOCK_CHARS, capacity: int = BLOCKS_PER_BACKEND) -> None:
        self.block_chars, self.capacity = block_chars, capacity
        self._blocks: dict[str, OrderedDict[int, None]] = {}  # backend -> its block keys, least recent first

    def keys(self, text: str) -> list[int]:
        """The key of each full block of TEXT: hash of the whole prefix up to that block's end."""
        out, prev = [], 0
        for start in range(0, len(text) - self.block_chars + 1, self.block_chars):
            prev = hash((prev, text[start:start + self.block_chars]))
            out.append(prev)
        return out

    def matched_blocks(self, backend: str, keys: list[int]) -> int:
        """How many leading blocks of KEYS BACKEND has seen (a prefix's blocks are all present or the chain breaks)."""
        blocks = self._blocks.get(backend)
        if not blocks:
            return 0
        n = 0
        for key in keys:
            if key not in blocks:
                break
            n += 1
        return n

    def insert(self, backend: str, keys: list[int]) -> None:
        """BACKEND now holds these blocks: most recent; its least recently used go past the capacity."""
        blocks = self._blocks.setdefault(backend, OrderedDict())
        for key in keys:
            blocks[key] = None
            blocks.move_to_end(key)
        while len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def size(self, backend: str) -> int:
        """Blocks remembered for BACKEND (SGLang's 'tree size': a new prefix goes where the least is cached)."""
        return len(self._blocks.get(backend, ()))

    def forget(self, backend: str) -> None:
        """BACKEND lost its cache (it went down; a restarted replica starts empty)."""
        self._blocks.pop(backend, None)
