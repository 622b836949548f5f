"""The one KV cache interface the step loop, the scheduler and the batched prefill call; how blocks are stored
is behind it (DESIGN §3: vLLM's kv_cache_manager + block_pool are the model).

A sequence holds a slot (the KV manager's sequence id: a batch row of a slot engine, a block table of a paged
one) from allocate to free; length(slot) is the positions the engine has written, advance / rewind move it.
Two storages implement it:

    kv_cache.KVCacheManager            the slot layout: one [slots, kv_heads, max_seq, head_dim] buffer per
                                       layer, a slot reserves its whole row at allocate (nothing to grow)
    paged_kv_cache.PagedKVCacheManager the paged layout: blocks of a shared pool (block_pool.py) mapped by a
                                       per-slot table (block_manager.py), grown as decoding proceeds, forked
                                       copy-on-write, prefixes shared by reference through a radix tree

Both keep the one KV budget (block_budget.py) in blocks: the paged layout its pool's, capped by the budget when
one is given; the slot layout a pool of counts only (virtual_block_pool.py), since its rows are whole from
allocate. The scheduler admits, grows and preempts by asking this interface alone (budget_for, use_budget,
blocks_to_grow, held_blocks, available_blocks, has_blocks, grow, admits) and keeps no books of its own.

What else differs between them is asked through this interface too (blocks_to_write, prepare_writes,
rows_fit_one_call, prefix_cache, sized_by_bytes, capacity_words): nothing outside this package branches on the
layout (tests/architecture/test_layers.py checks it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np

from engine_builder.runner.kv.block_budget import BlockBudget
from engine_builder.util.errors import CapacityError, InputError


class KVCache(ABC):
    """Which request holds each slot, how many positions it has filled and reserved (the bookkeeping both
    storages share, so admission refuses the same requests with the same words whichever the layout), and the
    storage operations each layout implements."""

    def __init__(self, batch_slots: int, max_seq: int) -> None:
        self.batch_slots, self.max_seq = batch_slots, max_seq
        self.lengths = np.zeros(batch_slots, np.int64)  # [slots] filled positions = graph past_lengths
        self._reserved = np.zeros(batch_slots, np.int64)  # [slots] prompt_len + max_new_tokens
        self._owner: list[object | None] = [None] * batch_slots
        self._slot_of: dict[object, int] = {}

    @property
    def num_free(self) -> int:
        return self._owner.count(None)

    def _admit(self, request_id: object, prompt_len: int, max_new_tokens: int) -> tuple[int, int]:
        """(the lowest free slot, the positions the request needs), or the error that refuses it; nothing is
        taken yet (the caller may still fail to find storage)."""
        if request_id in self._slot_of:
            raise InputError(f"request {request_id!r} already holds KV cache slot {self._slot_of[request_id]}; "
                             "use a unique request id")
        if prompt_len < 1:
            raise InputError(f"request {request_id!r} has an empty prompt; give at least one token")
        if max_new_tokens < 1:
            raise InputError(f"request {request_id!r}: max_new_tokens must be >= 1, got {max_new_tokens}")
        needed = prompt_len + max_new_tokens
        if needed > self.max_seq:
            raise CapacityError(
                f"request {request_id!r} needs {needed} positions (prompt {prompt_len} + max_new_tokens "
                f"{max_new_tokens}), engine max_seq_len is {self.max_seq}; shorten the prompt or lower "
                f"max_new_tokens, or rebuild with --max-seq-len")
        if None not in self._owner:
            raise CapacityError(
                f"all {self.batch_slots} KV cache slots are in use; wait for a running request to finish "
                f"(free its slot) before admitting request {request_id!r}, or rebuild the engine for a larger batch")
        return self._owner.index(None), needed

    def _take(self, slot: int, request_id: object, needed: int) -> None:
        self._owner[slot], self._slot_of[request_id] = request_id, slot
        self.lengths[slot], self._reserved[slot] = 0, needed

    def _release(self, slot: int) -> None:
        owner = self._check_slot(slot)
        self.lengths[slot] = self._reserved[slot] = 0
        self._owner[slot] = None
        del self._slot_of[owner]

    def hand_over(self, slot: int, request_id: object) -> None:
        """Give a held slot, its cache and length as they are, to another owner (a draft's parked prefix)."""
        owner = self._check_slot(slot)
        if request_id in self._slot_of:
            raise ValueError(f"{request_id!r} already holds slot {self._slot_of[request_id]}")
        del self._slot_of[owner]
        self._owner[slot], self._slot_of[request_id] = request_id, slot

    def length(self, slot: int) -> int:
        self._check_slot(slot)
        return int(self.lengths[slot])

    def reserved(self, slot: int) -> int:
        self._check_slot(slot)
        return int(self._reserved[slot])

    def slot_of(self, request_id: object) -> int | None:
        return self._slot_of.get(request_id)

    def is_free(self, slot: int) -> bool:
        """Does no request hold this slot?"""
        return self._owner[slot] is None

    def _advanced_length(self, slot: int, num_tokens: int) -> int:
        """The slot's length after the engine wrote num_tokens more positions."""
        self._check_slot(slot)
        new_length = int(self.lengths[slot]) + num_tokens
        if num_tokens < 0 or new_length > self._reserved[slot]:
            # a generation-loop bug, not user input: it bypassed the stop-at-max_new_tokens check
            raise ValueError(f"slot {slot} would hold {new_length} positions but reserved {self._reserved[slot]}")
        return new_length

    def _check_slot(self, slot: int) -> object:
        if not 0 <= slot < self.batch_slots:
            raise ValueError(f"slot {slot} is out of range [0, {self.batch_slots})")
        owner = self._owner[slot]
        if owner is None:
            raise ValueError(f"slot {slot} is not allocated (already freed?)")
        return owner

    # --- the storage: what each layout implements ---------------------------------------------------------

    @abstractmethod
    def allocate(self, request_id: object, prompt_len: int, max_new_tokens: int,
                 initial_tokens: int | None = None) -> int:
        """Reserve a slot (lowest free first) for prompt + max_new_tokens positions; storage for all of them, or
        for initial_tokens where the layout grows (optimistic admission). Returns the slot."""

    @abstractmethod
    def free(self, slot: int) -> None:
        """Give the slot and its storage back."""

    def allocate_sequences(self, request_id: object, prompt_len: int, max_new_tokens: int, count: int,
                           initial_tokens: int | None = None) -> tuple[int, ...]:
        """COUNT slots for one request, all or none: its one slot (storage for initial_tokens where the layout
        grows), or a beam search's slot per beam, each whole (a fork re-reserves its fork's whole length); beam b
        > 0 is held as (request_id, "beam", b)."""
        if count == 1:
            return (self.allocate(request_id, prompt_len, max_new_tokens, initial_tokens),)
        slots: list[int] = []
        try:
            for b in range(count):
                slots.append(self.allocate(request_id if b == 0 else (request_id, "beam", b), prompt_len,
                                           max_new_tokens))
        except BaseException:
            for s in slots:  # nothing written yet: the storage is as it was
                self.free(s)
            raise
        return tuple(slots)

    @abstractmethod
    def advance(self, slot: int, num_tokens: int) -> None:
        """Record that the engine wrote num_tokens more positions into this slot."""

    @abstractmethod
    def rewind(self, slot: int, length: int) -> None:
        """Forget positions length.. of this slot (e.g. to re-prefill a sequence)."""

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of KV storage this cache holds."""

    # --- the one KV budget, in blocks (block_budget.py) ------------------------------------------------------

    @property
    @abstractmethod
    def budget(self) -> BlockBudget:
        """The budget this storage counts by now."""

    @abstractmethod
    def budget_for(self, tokens: int | None, block_tokens: int) -> BlockBudget:
        """The budget a scheduler asking for `tokens` (None: what the storage holds) in blocks of block_tokens gets
        on this storage, without taking it (ConfigError when it holds no block)."""

    @abstractmethod
    def use_budget(self, budget: BlockBudget) -> None:
        """Count by `budget` (one budget_for gave) from now on."""

    def blocks_for(self, tokens: int) -> int:
        return self.budget.blocks_for(tokens)

    @abstractmethod
    def held_blocks(self, slot: int) -> int:
        """Budget blocks SLOT holds."""

    def blocks_to_grow(self, slot: int, n_tokens: int) -> int:
        """Budget blocks grow(slot, n_tokens) would take."""
        return max(0, self.blocks_for(min(n_tokens, int(self._reserved[slot]))) - self.held_blocks(slot))

    @abstractmethod
    def available_blocks(self) -> int:
        """Budget blocks a growth or an allocation could take now."""

    def has_blocks(self, n: int) -> bool:
        """Could a growth or an allocation take N blocks now? (available_blocks() >= n, asked cheaply.)"""
        return n <= self.available_blocks()

    @abstractmethod
    def grow(self, slot: int, n_tokens: int) -> None:
        """Blocks for SLOT's first n_tokens positions (at most its reservation); CapacityError when short."""

    def admits(self, tokens: int, keep: float) -> bool:
        """Could a new sequence get blocks for its first `tokens` positions now, keeping `keep` (a share) of the
        budget free for the running ones' growth? (Conservative: a prefix-cache hit would map some instead.)"""
        reserve = max(1, int(self.budget.blocks * keep)) if keep else 0
        return self.has_blocks(self.blocks_for(tokens) + reserve)

    @abstractmethod
    def used_blocks(self) -> int:
        """Budget blocks running sequences hold (a figure for stats: safe to ask from another thread)."""

    def blocks_to_write(self, slot: int, n_tokens: int) -> int:
        """Storage blocks a write reaching position n_tokens of SLOT needs first (prepare_writes takes them): what
        grow would take where blocks are the storage."""
        return self.blocks_to_grow(slot, n_tokens)

    # --- the rest of the storage --------------------------------------------------------------------------

    def prepare_writes(self, slots: Sequence[int], counts: Sequence[int]) -> None:  # noqa: B027
        """Before a step writing counts[i] positions at slots[i]'s length: storage for them, and private copies
        of shared blocks (copy-on-write). A whole row needs neither."""

    @abstractmethod
    def rows_fit_one_call(self, starts: dict[int, int], width: int) -> bool:
        """Can one slot-engine call of `width` tokens over slots min(starts)..max(starts), each row of starts
        (slot -> where its tokens start) written there and the slots between riding along at their own
        lengths, give every row exactly the logits of its own call? (batched_prefill.py)"""

    def prefix_cache(self, budget_bytes: int | None = None, block_size: int | None = None):
        """Prefix reuse over this storage (load / store / stats), or None where it has none: the paged layout
        maps cached blocks by reference, the slot layout copies them into the slot."""
        return None

    sized_by_bytes = False  # can a byte budget size this storage (--kv-cache-memory)?
    reservation_is_free = False  # does a slot hold storage for max_seq positions whatever it reserves?

    def capacity_words(self) -> str:
        """What holds the KV, for a message that says it is too small."""
        return "the KV cache"
