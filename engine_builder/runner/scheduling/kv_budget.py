"""The executor's KV cache budget, in blocks of tokens: what admission and preemption count.

    budget = KVBudget(block_size=16, total_blocks=64)     # 1,024 tokens of KV for all sequences together
    budget.blocks_for(prompt_len + max_new_tokens)        # what one request needs, rounded up to blocks
    budget.hold(request_id, n); budget.grow(request_id, 1); budget.release(request_id)

Today's cache gives each sequence a slot of max_seq_len positions for life (runner/kv/kv_cache.py), so
admitting by free slots alone runs at most max_batch sequences whatever their lengths, and a
deployment sized for a few long sequences runs few short ones. Counting what each request can
actually write (its context so far, rounded up to blocks) lets a budget that holds 4 full
max_seq_len sequences run 32 short ones together: what a block pool would hold, decided by the
same arithmetic vLLM's scheduler does over its free block count. Admission is optimistic, as in
vLLM: a request holds the blocks of its context (+ the next step's tokens) and grows by a block when
its decode crosses into one (kv_growth.py); when none is free, the least urgent running request is
preempted by recompute and gives its blocks back.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_builder.util.errors import ConfigError


@dataclass(frozen=True)
class KVBudgetStats:
    block_size: int  # tokens per block
    total_blocks: int
    used_blocks: int  # held by admitted requests

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks


class KVBudget:
    def __init__(self, block_size: int, total_blocks: int) -> None:
        if block_size < 1 or total_blocks < 1:
            raise ConfigError(f"a KV budget needs block_size >= 1 and at least one block, got {block_size} "
                              f"tokens x {total_blocks} blocks; raise the KV cache budget")
        self.block_size, self.total_blocks = block_size, total_blocks
        self._held: dict[int, int] = {}  # request id -> blocks
        self._used = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def free(self) -> int:
        return self.total_blocks - self._used

    def held(self, request_id: int) -> int:
        return self._held.get(request_id, 0)

    def fits(self, blocks: int) -> bool:
        return blocks <= self.free

    def hold(self, request_id: int, blocks: int) -> None:
        if request_id in self._held:
            raise ValueError(f"request {request_id} already holds {self._held[request_id]} KV blocks")
        if blocks > self.free:
            raise ValueError(f"request {request_id} needs {blocks} KV blocks, {self.free} are free")
        self._held[request_id] = blocks
        self._used += blocks

    def grow(self, request_id: int, blocks: int) -> None:
        """A running request takes `blocks` more (its decode reached the end of what it holds)."""
        if request_id not in self._held:
            raise ValueError(f"request {request_id} holds no KV blocks to grow")
        if blocks > self.free:
            raise ValueError(f"request {request_id} needs {blocks} more KV blocks, {self.free} are free")
        self._held[request_id] += blocks
        self._used += blocks

    def release(self, request_id: int) -> None:
        """Give a request's blocks back (finished, cancelled, failed or preempted); a no-op if it holds none."""
        self._used -= self._held.pop(request_id, 0)

    def stats(self) -> KVBudgetStats:
        return KVBudgetStats(self.block_size, self.total_blocks, self._used)
