"""What the generation loop needs from an inference engine, and how one is chosen.

A backend owns the KV cache (runner/kv/kv_interface.py: slot = sequence, length = positions it holds) and runs one
engine call per step over a flat batch of tokens:

    forward(batch)                a ModelInput (runner/core/model_input.py): every sequence's new tokens, their
                                  positions and slots, and which tokens' logits come back; the logits
                                  [num_logits, vocab] float32 in the backend's own array type (numpy here, a
                                  device tensor for runner/torch_backend/). The one place a step runs an engine.
    step(first_slot, input_ids)   forward over rows first_slot.. [rows, seq], each row's last logits as numpy:
                                  for callers that read logits on the host (beams, verify, eval)

A slot engine (a static graph over a contiguous slot range) implements forward through its own three calls:

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from engine_builder.runner.core.model_input import ModelInput, SlotRows
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.kv.kv_interface import KVCache
from engine_builder.runner.sampler import Sampler
from engine_builder.util.errors import UnsupportedError

KVUpdate = Literal["in_place", "copy"]


@dataclass(frozen=True)
class WarmUp:
    """What a backend's warm_up took: seconds in all, of them compiling (torch.compile) and capturing decode graphs
    (`graphs` of them, one per batch-size bucket)."""

    seconds: float
    compile_seconds: float
    capture_seconds: float
    graphs: int


class Backend(ABC):
    name: ClassVar[str]  # what --backend calls it
    title: ClassVar[str]  # what messages call it
    kv: KVCache
    vocab_size: int
    kv_update: KVUpdate  # in_place: past and present share one buffer; copy: present is a separate buffer
    reprefill_after: int | None  # longrope: re-prefill a sequence when its length reaches this
    max_input_len: int  # longest multi-token step the engine takes (TensorRT prefill profile)
    logits_tail: int = 1  # a step's logits cover its last min(seq, logits_tail) positions (graph metadata)
    takes_images: bool = False  # a vision-language twin whose steps take image features (bind_images)
    # steps take ModelInput.device_tokens (the last step's samples left on the device: async scheduling)
    takes_device_tokens: bool = False
    # LLM(async_scheduling=None): async scheduling unless asked off (where the steps run on a GPU)
    async_by_default: bool = False
    execute_seconds: float  # wall time inside the engine call, summed over every step

    @classmethod
    @abstractmethod
    def usable(cls, engine: EngineDir) -> tuple[bool, str]:
        """Can this backend run ENGINE here, and why (or why not)? Decided before anything is loaded."""

    @classmethod
    def usable_when_asked(cls, engine: EngineDir) -> tuple[bool, str]:
        """usable(), for `--backend NAME` (a backend `auto` passes over here may still run when named)."""
        return cls.usable(engine)

    @classmethod
    @abstractmethod
    def open(cls, engine: EngineDir, *, threads: int | None = None) -> Backend:
        """The backend, loaded. threads: CPU threads where the backend computes on the CPU."""

    def forward(self, batch: ModelInput) -> Any:
        """Logits [num_logits, vocab] float32 of batch.logits_indices' tokens, after one engine call that writes
        every token's KV at its position. A slot engine runs it as one rectangle over the slots' range (rows no
        sequence of the batch holds ride along with token 0 at their own length, their logits dropped)."""
        if batch.device_tokens is not None:
            raise UnsupportedError(f"the {self.name} backend takes token ids from the host only (no async scheduling)")
        rows = SlotRows.of(batch)
        self.bind(rows.first_slot, rows.input_ids)
        if batch.images is not None:
            self.bind_images(rows.image_at, batch.images.embeds)
        self.execute()
        if rows.whole and rows.tail == 1:  # every row's last position in row order: the engine's own view
            return self.read_logits()
        tail = self.read_tail_logits()  # [rows, min(seq, logits_tail), vocab]
        if rows.tail > tail.shape[1]:
            raise ValueError(f"the batch wants logits {rows.tail} positions from a row's end, the engine returns "
                             f"{tail.shape[1]} (logits_tail)")
        if rows.whole and rows.tail == tail.shape[1]:
            return tail.reshape(-1, tail.shape[-1])
        return tail[rows.row_of, rows.tail_of + (tail.shape[1] - rows.tail)]

    def step(self, first_slot: int, input_ids: np.ndarray) -> np.ndarray:
        """forward over rows first_slot.. (input_ids [rows, seq] at each row's length): each row's last logits,
        [rows, vocab] float32 on the host."""
        lengths = self.kv.lengths[first_slot:first_slot + input_ids.shape[0]]
        return self.to_host(self.forward(ModelInput.rows(first_slot, input_ids, lengths)))

    def to_host(self, logits: Any) -> np.ndarray:
        """forward's logits as a numpy array (they already are, unless the backend computes on a device)."""
        return logits

    def make_sampler(self, seed: int | None = None) -> Sampler:
        """The sampler for this backend's logits: numpy's here; a device backend samples where its logits are."""
        return Sampler(seed)

    # a slot engine's three calls, which the default forward makes; a backend with a forward of its own needs none
    def bind(self, first_slot: int, input_ids: np.ndarray) -> None:
        raise NotImplementedError(f"{type(self).__name__} steps through forward(ModelInput) only")

    def execute(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} steps through forward(ModelInput) only")

    def bind_images(self, at: np.ndarray, embeds: np.ndarray) -> None:
        """After bind: image features embeds [k, hidden] in place of the token embeddings at flat positions `at` of
        the bound [rows, seq] ids, for the next execute only (a vision-language engine's twin)."""
        raise UnsupportedError(f"the {self.name} backend does not run image inputs; run this vision-language engine "
                               "with --backend onnxruntime")

    def read_logits(self) -> np.ndarray:
        raise NotImplementedError(f"{type(self).__name__} steps through forward(ModelInput) only")

    def read_tail_logits(self) -> np.ndarray:
        """[rows, min(seq, logits_tail), vocab] float32; a backend whose graph has logits_tail 1 gives the last."""
        return self.read_logits()[:, None]

    @abstractmethod
    def _copy_rows(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        """KV positions [0, length) of slots src[i] -> slots dst[i], every layer (src may repeat)."""

    def zero_rows(self, slot: int, length: int) -> None:  # noqa: B027  (a no-op unless the cache is on a device)
        """Zero positions [0, length) of a slot in buffers the KVCacheManager does not own."""

    def release(self, slot: int) -> None:
        """Free a slot; its buffers go back to zeros, as the graph contract asks."""
        used = self.kv.length(slot)
        self.kv.free(slot)
        self.zero_rows(slot, used)

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

    def warm_up(self, progress: Callable[[str], None] | None = None) -> WarmUp | None:
        """Compile and capture now what the first steps would (a server's start, before it listens), telling
        progress what; None: nothing to warm (a host backend's sessions are ready when opened)."""
        return None

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
