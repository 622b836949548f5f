"""Slot-based static KV cache: one preallocated buffer per layer, one slot per running request.

The decoder graph (engine_builder/formats/graph_io.py) takes the whole cache as
past_key.{i} / past_value.{i} [batch, kv_heads, max_seq, head_dim] plus past_lengths [batch]
and writes token t of row b at position past_lengths[b] + t. So a slot is a batch row, and
its length is that row's past_lengths entry. Buffers are allocated once, zero-filled (the
graph multiplies masked positions by a zero probability, and NaN * 0 is NaN), and a request
reserves prompt_len + max_new_tokens positions when admitted, so it can never run out of
cache half-way through generation.

Paged blocks and prefix reuse (`build --kv-layout paged`, runner/kv/paged_kv_cache.py) keep this interface:
  * allocate(request_id, prompt_len, max_new_tokens) stays the admission check. A paged
    manager would hand out blocks of a shared pool instead of a whole max_seq row, keep a
    per-request block table, and refuse only when the pool lacks free blocks.
  * length(slot) is the number of positions already filled, and the generation loop
    prefills only prompt[length(slot):]. Today that is 0 after allocate; with prefix reuse
    allocate would take the prompt ids, map cached blocks of a shared prefix into the new
    request, and start length at the reused prefix length. No caller change is needed.
  * advance(slot, n) after each engine step and free(slot) at the end stay as they are
    (free would drop block references instead of resetting a row).

The KV budget (block_budget.py) is counted here too, by a block pool of counts only (virtual_block_pool.py): a
slot's row is whole, but a slot holds only the budget blocks of what it may write (its context and the next
step's tokens when the scheduler admits it, growing as it decodes), so a budget of 4 full rows runs 32 short
requests. Until a scheduler gives it a budget (use_budget) it holds every slot's whole row, so a caller without
one (a draft model's cache, eval's scoring) is never refused by it.
"""

from __future__ import annotations

import numpy as np

from engine_builder.formats.graph_io import KVCacheLayout
from engine_builder.runner.kv.block_budget import BlockBudget, budget_blocks
from engine_builder.runner.kv.kv_interface import KVCache
from engine_builder.runner.kv.prefix_cache import PrefixCache
from engine_builder.runner.kv.virtual_block_pool import VirtualBlockPool
from engine_builder.runner.tunables import KV_BUDGET_BLOCK_TOKENS
from engine_builder.util.errors import InputError


def _kv_dtype(dtype) -> np.dtype:
    if str(dtype) == "bfloat16":  # numpy has no bfloat16; onnxruntime takes ml_dtypes' one
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(dtype)
    except TypeError as e:
        raise InputError(f"KV cache dtype {dtype!r} is not a numpy dtype; use float16, bfloat16 or float32") from e


class KVCacheManager(KVCache):
    reservation_is_free = True  # a slot is a whole max_seq row from allocate

    def __init__(self, num_layers: int, batch_slots: int, kv_heads: int, max_seq: int, head_dim: int,
                 dtype="float16", host_buffers: bool = True) -> None:
        for name, value in (("num_layers", num_layers), ("batch_slots", batch_slots), ("kv_heads", kv_heads),
                            ("max_seq", max_seq), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"KV cache {name} must be a positive integer, got {value!r}")
        self.num_layers = num_layers
        self.dtype = _kv_dtype(dtype)
        shape = (batch_slots, kv_heads, max_seq, head_dim)
        # np.zeros maps zero pages lazily: untouched positions of idle slots cost no RAM
        # per layer: [slots, kv_heads, max_seq, head_dim]
        # host_buffers=False: slot bookkeeping only, for a backend whose cache lives on a GPU (it
        # zeroes its own rows when a slot is freed); keys/values are then empty.
        self.keys = tuple(np.zeros(shape, self.dtype) for _ in range(num_layers)) if host_buffers else ()
        self.values = tuple(np.zeros(shape, self.dtype) for _ in range(num_layers)) if host_buffers else ()
        KVCache.__init__(self, batch_slots, max_seq)
        whole_rows = BlockBudget(KV_BUDGET_BLOCK_TOKENS, batch_slots * -(-max_seq // KV_BUDGET_BLOCK_TOKENS))
        self._budget_pool = VirtualBlockPool(whole_rows, batch_slots)

    @classmethod
    def for_layout(cls, layout: KVCacheLayout, batch_slots: int, host_buffers: bool = True) -> KVCacheManager:
        """batch_slots sequences of the graph's cache layout (formats/graph_io.py)."""
        return cls(layout.num_layers, batch_slots, layout.kv_heads, layout.max_seq, layout.head_dim, layout.dtype,
                   host_buffers)

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values))

    def allocate(self, request_id: object, prompt_len: int, max_new_tokens: int,
                 initial_tokens: int | None = None) -> int:
        """Reserve a slot for the whole request; returns its index (lowest free first). Its row is max_seq
        positions from the start; the budget's blocks it takes are for all of them or, given initial_tokens (the
        scheduler's optimistic start), for that many (grow() adds the rest as needed)."""
        slot, needed = self._admit(request_id, prompt_len, max_new_tokens)
        first = needed if initial_tokens is None else min(needed, max(1, initial_tokens))
        self._budget_pool.take(slot, self.blocks_for(first))  # CapacityError when the budget is short
        self._take(slot, request_id, needed)
        return slot

    def free(self, slot: int) -> None:
        self._check_slot(slot)
        used = int(self.lengths[slot])
        # Zero what this request wrote so the next one starts from the zero-filled buffers the
        # graph contract assumes (an inf left behind would turn into NaN through the mask).
        for k, v in zip(self.keys, self.values):
            k[slot, :, :used] = 0
            v[slot, :, :used] = 0
        self._release(slot)
        self._budget_pool.free_slot(slot)

    def advance(self, slot: int, num_tokens: int) -> None:
        """Record that the engine wrote num_tokens more positions into this slot."""
        self.lengths[slot] = self._advanced_length(slot, num_tokens)

    def rewind(self, slot: int, length: int) -> None:
        """Forget positions length.. of this slot (zeroed, as on free), e.g. to re-prefill a sequence."""
        self._check_slot(slot)
        used = int(self.lengths[slot])
        if not 0 <= length <= used:
            raise ValueError(f"slot {slot} holds {used} positions; cannot rewind to {length}")
        for k, v in zip(self.keys, self.values):
            k[slot, :, length:used] = 0
            v[slot, :, length:used] = 0
        self.lengths[slot] = length

    # --- the KV budget: counts only ----------------------------------------------------------------------

    @property
    def budget(self) -> BlockBudget:
        return self._budget_pool.budget

    def budget_for(self, tokens: int | None, block_tokens: int) -> BlockBudget:
        """`tokens` in blocks of block_tokens; None: every slot's max_seq_len."""
        tokens = tokens if tokens is not None else self.batch_slots * self.max_seq
        return BlockBudget(block_tokens, budget_blocks(tokens, block_tokens))

    def use_budget(self, budget: BlockBudget) -> None:
        if budget != self._budget_pool.budget:
            self._budget_pool.resize(budget)

    def held_blocks(self, slot: int) -> int:
        return int(self._budget_pool.held[slot])

    def available_blocks(self) -> int:
        return self._budget_pool.free

    def grow(self, slot: int, n_tokens: int) -> None:
        self._check_slot(slot)
        if (extra := self.blocks_to_grow(slot, n_tokens)) > 0:
            self._budget_pool.take(slot, extra)

    def used_blocks(self) -> int:
        return self._budget_pool.used

    def blocks_to_write(self, slot: int, n_tokens: int) -> int:
        return 0  # a write lands in the slot's own row, whole from allocate: the budget's blocks are books only

    def rows_fit_one_call(self, starts: dict[int, int], width: int) -> bool:
        # every row, riders included, at 0: a row past 0 takes the twin's generic attention branch (not its solo
        # call's numerics), or a call per row without the If
        lo, hi = min(starts), max(starts) + 1
        rows = self.lengths[lo:hi].copy()
        for slot, at in starts.items():
            rows[slot - lo] = at
        return not rows.any() and width <= self.max_seq

    def prefix_cache(self, budget_bytes: int | None = None, block_size: int | None = None) -> PrefixCache | None:
        """A radix tree of block copies, copied into a slot on a hit; none where the buffers live on a device."""
        if not self.keys:
            return None
        options = {"budget_bytes": budget_bytes, "block_size": block_size}
        return PrefixCache(self, **{k: v for k, v in options.items() if v is not None})
