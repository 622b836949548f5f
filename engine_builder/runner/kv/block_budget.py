"""The one KV budget, in blocks: what admission, growth and preemption count, asked through the KV interface.

    budget = kv.budget_for(kv_budget_tokens, block_tokens)   # a scheduler's budget on this storage (nothing taken)
    kv.use_budget(budget)                                    # the storage counts by it from now on
    budget.blocks_for(prompt_len + max_new_tokens)           # what one request needs, rounded up to blocks

Counting what each request can actually write (its context so far, rounded up to blocks) rather than giving each a
max_seq_len row lets a budget that holds 4 full sequences run 32 short ones together: vLLM's arithmetic over its
free block count. Both storages keep that count themselves (kv_interface.py): a paged pool's blocks, capped by the
budget when one is given, and for the slot layout, whose rows are whole from allocate, a pool of counts only
(virtual_block_pool.py). So a paged engine is not counted twice (a budget beside its pool), and the scheduler
keeps no books of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine_builder.util.errors import ConfigError


@dataclass(frozen=True)
class BlockBudget:
    block_tokens: int  # KV positions per block
    blocks: int  # blocks all running sequences may hold together

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_tokens


@dataclass(frozen=True)
class KVBudgetStats:
    """The budget's figures for the executor's stats and /metrics (server/metrics.py)."""

    block_size: int  # tokens per block
    total_blocks: int
    used_blocks: int  # held by running requests

    @property
    def free_blocks(self) -> int:
        return self.total_blocks - self.used_blocks


def budget_blocks(tokens: int, block_tokens: int) -> int:
    """Whole blocks of block_tokens in a budget of `tokens`; ConfigError when not even one."""
    blocks = tokens // block_tokens
    if blocks < 1:
        raise ConfigError(f"a KV budget of {tokens} tokens holds no block of {block_tokens} tokens; raise the budget")
    return blocks
