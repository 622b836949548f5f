"""Slot-based static KV cache: one preallocated buffer per layer, one slot per running request.

The decoder graph (engine_builder/formats/graph_io.py) takes the whole cache as
past_key.{i} / past_value.{i} [batch, kv_heads, max_seq, head_dim] plus past_lengths [batch]
and writes token t of row b at position past_lengths[b] + t. So a slot is a batch row, and
its length is that row's past_lengths entry. Buffers are allocated once, zero-filled (the
graph multiplies masked positions by a zero probability, and NaN * 0 is NaN), and a request
reserves prompt_len + max_new_tokens positions when admitted, so it can never run out of
cache half-way through generation.

Paged blocks and prefix reuse (`build --kv-layout paged`, runner/paged_kv_cache.py) keep this interface:
  * allocate(request_id, prompt_len, max_new_tokens) stays the admission check. A paged
    manager would hand out blocks of a shared pool instead of a whole max_seq row, keep a
    per-request block table, and refuse only when the pool lacks free blocks.
  * length(slot) is the number of positions already filled, and the generation loop
    prefills only prompt[length(slot):]. Today that is 0 after allocate; with prefix reuse
    allocate would take the prompt ids, map cached blocks of a shared prefix into the new
    request, and start length at the reused prefix length. No caller change is needed.
  * advance(slot, n) after each engine step and free(slot) at the end stay as they are
    (free would drop block references instead of resetting a row).
"""

from __future__ import annotations

import numpy as np

from engine_builder.formats.graph_io import KVCacheLayout
from engine_builder.util.errors import CapacityError, InputError


def _kv_dtype(dtype) -> np.dtype:
    if str(dtype) == "bfloat16":  # numpy has no bfloat16; onnxruntime takes ml_dtypes' one
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(dtype)
    except TypeError as e:
        raise InputError(f"KV cache dtype {dtype!r} is not a numpy dtype; use float16, bfloat16 or float32") from e


class SlotTable:
    """Which request holds each slot (batch row), and how many positions it has filled and reserved: the
    bookkeeping of both KV caches (KVCacheManager below over per-slot buffers, paged_kv_cache.py over a
    block pool), so admission refuses the same requests with the same words whichever the engine's layout."""

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


class KVCacheManager(SlotTable):
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
        SlotTable.__init__(self, batch_slots, max_seq)

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
        """Reserve a slot for the whole request; returns its index (lowest free first). initial_tokens (a paged
        cache's optimistic start) changes nothing here: a slot's row is max_seq positions from the start."""
        slot, needed = self._admit(request_id, prompt_len, max_new_tokens)
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
