"""What the generation loop needs from an inference engine, and how one is chosen.

A backend owns the static KV cache (one KVCacheManager: slot = batch row, length = the graph's
past_lengths entry) and runs one decoder step over a contiguous range of slots:

    bind(first_slot, input_ids)   input_ids [rows, seq] int64 for slots first_slot..first_slot+rows-1,
                                  each written at its current length (position_ids = length + t)
    execute()                     one engine call; `execute_seconds` accumulates its wall time
    read_logits()                 [rows, vocab] float32 of each row's last position, a view that
                                  stays valid until the next step (copy it to keep it)

It does not advance the cache lengths: the loop calls kv.advance for the slots that hold a
request, so slots that ride along idle in a batched decode (length 0: they write one junk entry at
position 0, which the next prefill of that slot overwrites first) never count as filled.

backend="auto" takes TensorRT when the engine dir has an engine that `compatibility_verdict`
says can run on this machine, and onnxruntime on the ONNX twin otherwise; the reason is kept so
`trtbuild run --json` and LLM.backend_reason can say why.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from engine_builder.errors import InputError, UnsupportedError
from engine_builder.runner.engine_dir import EngineDir
from engine_builder.runner.kv_cache import KVCacheManager

BACKENDS = ("auto", "onnxruntime", "tensorrt")
KVUpdate = Literal["in_place", "copy"]


class Backend(ABC):
    name: ClassVar[str]
    kv: KVCacheManager
    vocab_size: int
    kv_update: KVUpdate  # in_place: past and present share one buffer; copy: present is a separate buffer
    reprefill_after: int | None  # longrope: re-prefill a sequence when its length reaches this
    max_input_len: int  # longest multi-token step the engine takes (TensorRT prefill profile)
    execute_seconds: float  # wall time inside the engine call, summed over every step

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


@dataclass(frozen=True)
class BackendChoice:
    name: str  # onnxruntime | tensorrt
    reason: str  # why this one: the TensorRT verdict, or the user's request


def choose_backend(engine: EngineDir, backend: str = "auto") -> BackendChoice:
    """Which backend `backend` means for this engine dir on this machine, and why."""
    if backend not in BACKENDS:
        raise InputError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    if backend == "onnxruntime":
        return BackendChoice("onnxruntime", "requested")
    ok, verdict = trt_verdict(engine)
    if backend == "tensorrt":
        if not ok:
            raise UnsupportedError(f"cannot use the TensorRT engine in {engine.path}: {verdict}; "
                                   "run with --backend onnxruntime (or auto) to use the ONNX twin on CPU")
        return BackendChoice("tensorrt", verdict)
    if ok:
        return BackendChoice("tensorrt", verdict)
    return BackendChoice("onnxruntime", f"TensorRT not usable: {verdict}")


def trt_verdict(engine: EngineDir) -> tuple[bool, str]:
    """compatibility_verdict for the engine dir's rank0.engine, or why there is none."""
    if not engine.tensorrt or "tensorrt" not in engine.targets:
        return False, "the engine dir was built without the tensorrt target"
    from engine_builder.trt_inspect import compatibility_verdict

    return compatibility_verdict(engine.tensorrt, engine_path=engine.engine_path)


def open_backend(engine: EngineDir, backend: str = "auto", *,
                 threads: int | None = None) -> tuple[Backend, BackendChoice]:
    """The chosen backend, opened. threads: onnxruntime intra-op threads (default: physical cores)."""
    choice = choose_backend(engine, backend)
    if choice.name == "tensorrt":
        from engine_builder.runner.trt_backend import TrtBackend

        return TrtBackend(engine), choice
    from engine_builder.runner.ort_backend import OrtBackend

    return OrtBackend(engine, threads=threads), choice


def physical_cores() -> int:
    """Physical cores this process may run on: onnxruntime's intra-op threads.

    Hyper-threads share a core's FMA units, so a second thread per core adds contention rather
    than throughput for GEMM-bound decoding (onnxruntime's own default is also one per core).
    """
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = _cores_from_cpuinfo(Path("/proc/cpuinfo"))
    if cores is None:
        try:
            import psutil  # optional: not a dependency

            cores = psutil.cpu_count(logical=False)
        except ImportError:
            cores = None
    return max(1, min(cores or allowed, allowed))


def _cores_from_cpuinfo(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    pairs = set()
    for block in text.split("\n\n"):
        phys = re.search(r"^physical id\s*:\s*(\d+)", block, re.M)
        core = re.search(r"^core id\s*:\s*(\d+)", block, re.M)
        if phys and core:
            pairs.add((phys[1], core[1]))
    return len(pairs) or None
