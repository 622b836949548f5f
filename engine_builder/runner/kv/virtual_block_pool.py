"""The slot layout's KV budget: a block pool of counts only, no storage.

A slot engine's storage is one max_seq_len row per slot, whole from allocate (kv_cache.py), so its storage never
runs short; what bounds how many sequences run together is the budget (block_budget.py). This pool answers what a
paged pool answers (blocks a slot holds, blocks free, take, free) from counts, so the scheduler asks both layouts
the same questions and admits, grows and preempts by the same arithmetic.
"""

from __future__ import annotations

import numpy as np

from engine_builder.runner.kv.block_budget import BlockBudget
from engine_builder.util.errors import CapacityError


class VirtualBlockPool:
    def __init__(self, budget: BlockBudget, slots: int) -> None:
        self.budget = budget
        self.held = np.zeros(slots, np.int64)  # [slots] blocks each slot holds
        self.used = 0

    @property
    def free(self) -> int:
        return self.budget.blocks - self.used

    def resize(self, budget: BlockBudget) -> None:
        """Count by `budget` from now on; the blocks held stay held (a smaller budget only delays admissions)."""
        if budget.block_tokens != self.budget.block_tokens and self.used:
            raise ValueError(f"{self.used} KV blocks of {self.budget.block_tokens} tokens are held; a budget in "
                             f"blocks of {budget.block_tokens} can only be taken when none is")
        self.budget = budget

    def take(self, slot: int, blocks: int) -> None:
        if blocks > self.free:
            raise CapacityError(f"the KV budget needs {blocks} free blocks but has {self.free} of "
                                f"{self.budget.blocks}; wait for running requests to finish, or raise the KV "
                                "budget (kv_budget_tokens, --kv-budget-tokens)")
        self.held[slot] += blocks
        self.used += blocks

    def free_slot(self, slot: int) -> None:
        self.used -= int(self.held[slot])
        self.held[slot] = 0
