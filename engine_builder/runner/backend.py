"""What the generation loop needs from an inference engine, and how one is chosen.

A backend owns the static KV cache (one KVCacheManager: slot = batch row, length = the graph's
past_lengths entry) and runs one decoder step over a contiguous range of slots:

    bind(first_slot, input_ids)   input_ids [rows, seq] int64 for slots first_slot..first_slot+rows-1,
                                  each written at its current length (position_ids = length + t)
    execute()                     one engine call; `execute_seconds` accumulates its wall time
    read_logits()                 [rows, vocab] float32 of each row's last position, a view that
                                  stays valid until the next step (copy it to keep it)
    read_tail_logits()            [rows, min(seq, logits_tail), vocab]: the last positions' logits, all of
                                  them for a speculative verify step of seq <= logits_tail tokens

It does not advance the cache lengths: the loop calls kv.advance for the slots that hold a
request, so slots that ride along idle in a batched decode (length 0: they write one junk entry at
position 0, which the next prefill of that slot overwrites first) never count as filled.

Each implementation registers itself with `@register_backend(preference)` and says, from the
manifest and the host alone, whether it can run an engine dir here (`usable`). Which one runs is
backend_choice.py's business; the generation loop only sees this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Literal

import numpy as np

from engine_builder.runner.engine import EngineDir
from engine_builder.runner.kv_cache import KVCacheManager

KVUpdate = Literal["in_place", "copy"]


class Backend(ABC):
    name: ClassVar[str]  # what --backend calls it
    title: ClassVar[str]  # what messages call it
    kv: KVCacheManager
    vocab_size: int
    kv_update: KVUpdate  # in_place: past and present share one buffer; copy: present is a separate buffer
    reprefill_after: int | None  # longrope: re-prefill a sequence when its length reaches this
    max_input_len: int  # longest multi-token step the engine takes (TensorRT prefill profile)
    logits_tail: int = 1  # a step's logits cover its last min(seq, logits_tail) positions (graph metadata)
    execute_seconds: float  # wall time inside the engine call, summed over every step

    @classmethod
    @abstractmethod
    def usable(cls, engine: EngineDir) -> tuple[bool, str]:
        """Can this backend run ENGINE here, and why (or why not)? Decided before anything is loaded."""

    @classmethod
    @abstractmethod
    def open(cls, engine: EngineDir, *, threads: int | None = None) -> Backend:
        """The backend, loaded. threads: CPU threads where the backend computes on the CPU."""

    def step(self, first_slot: int, input_ids: np.ndarray) -> np.ndarray:
        """bind + execute + read_logits: logits [rows, vocab] float32."""
        self.bind(first_slot, input_ids)
        self.execute()
        return self.read_logits()

    @abstractmethod
    def bind(self, first_slot: int, input_ids: np.ndarray) -> None: ...

    @abstractmethod
    def execute(self) -> None: ...

    @abstractmethod
    def read_logits(self) -> np.ndarray: ...

    def read_tail_logits(self) -> np.ndarray:
        """[rows, min(seq, logits_tail), vocab] float32; a backend whose graph has logits_tail 1 gives the last."""
        return self.read_logits()[:, None]

    @abstractmethod
    def _copy_rows(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        """KV positions [0, length) of slots src[i] -> slots dst[i], every layer (src may repeat)."""

    def _zero_rows(self, slot: int, length: int) -> None:  # noqa: B027  (a no-op unless the cache is on a device)
        """Zero positions [0, length) of a slot in buffers the KVCacheManager does not own."""

    def release(self, slot: int) -> None:
        """Free a slot; its buffers go back to zeros, as the graph contract asks."""
        used = self.kv.length(slot)
        self.kv.free(slot)
        self._zero_rows(slot, used)

    def copy_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Make each dst slot a copy of src slot (cache and length): beam fan-out and reordering."""
        lengths = [self.kv.length(s) for s in src]
        if not lengths:
            return
        self._copy_rows(src, dst, max(lengths))
        for d, n in zip(dst, lengths):
            have = self.kv.length(d)
            if n >= have:
                self.kv.advance(d, n - have)
            else:
                self.kv.rewind(d, n)

    def close(self) -> None:  # noqa: B027  (optional: nothing to release by default)
        """Release engine resources; the backend cannot be used afterwards."""


_REGISTRY: dict[str, tuple[int, type[Backend]]] = {}


def register_backend(preference: int):
    """Register a Backend subclass under its `name`; "auto" tries the usable ones, highest preference first."""

    def decorate(cls: type[Backend]) -> type[Backend]:
        _REGISTRY[cls.name] = (preference, cls)
        return cls

    return decorate


def registered_backends() -> list[type[Backend]]:
    """Every registered backend, the preferred first."""
    return [cls for _, cls in sorted(_REGISTRY.values(), key=lambda entry: -entry[0])]
