"""The driver of a tp/pp engine: rank 0's Backend, which every other rank follows (worker.py).

Rank 0 runs the ordinary generation loop (runner/generate.py: sampling, stopping, streaming, the KV slot
bookkeeping) over this backend. Each backend call becomes one command broadcast to every rank over the
control group, then executed by all of them together (rank_runner.py):

    [OPEN, SEGMENTS, 0, 0]         (first: which runner the ranks open; torch_ranks.py's driver says TORCH
                                    and has commands of its own, listed there)
    [STEP, first_slot, rows, seq]  + input_ids [rows * seq] + past_lengths [rows]
    [COPY, n, length, 0]           + src [n] + dst [n]             (beam fan-out, reordering)
    [ZERO, slot, length, 0]                                        (a freed slot's positions)
    [STOP, 0, 0, 0]                                                (close: the workers return)
"""

from __future__ import annotations

import atexit
import time
from collections.abc import Sequence

import numpy as np

from engine_builder.runner.backend import Backend
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.kv.kv_cache import KVCacheManager
from engine_builder.runner.parallel.collectives import Collectives
from engine_builder.runner.parallel.rank_runner import RankRunner

STOP, STEP, COPY, ZERO, OPEN = 0, 1, 2, 3, 4
HEADER = 4
SEGMENTS, TORCH = 0, 1  # OPEN's runner: onnxruntime segments (rank_runner.py), the torch decoder (torch_ranks.py)


def default_threads(comm: Collectives) -> int:
    """CPU threads per rank (onnxruntime's, or a torch rank's OpenBLAS's): this host's physical cores shared by its
    ranks."""
    from engine_builder.util.cpu_cores import physical_cores

    return max(1, physical_cores() // comm.env.local_world_size)


class ParallelBackend(Backend):
    name = "parallel"
    title = "onnxruntime tp/pp ranks"
    kv_update = "copy"
    reprefill_after = None

    @classmethod
    def usable(cls, engine: EngineDir) -> tuple[bool, str]:
        mapping = engine.manifest.mapping
        if mapping is None:
            return False, "not a tp/pp engine dir"
        return True, f"tp={mapping.tp} pp={mapping.pp}"

    @classmethod
    def open(cls, engine: EngineDir, *, threads: int | None = None) -> ParallelBackend:
        return cls(engine, threads=threads)

    def __init__(self, engine: EngineDir, *, threads: int | None = None,
                 comm: Collectives | None = None) -> None:
        engine.check_host_memory()  # onnxruntime segments, sized before any allocation or collective
        mapping = engine.manifest.mapping
        assert mapping is not None
        self.comm = comm or Collectives(mapping)
        if self.comm.rank != 0:
            raise AssertionError("ParallelBackend runs on rank 0; other ranks run worker.follow()")
        self.comm.broadcast_ints(np.array([OPEN, SEGMENTS, 0, 0]), HEADER)
        self.runner = RankRunner(engine.path, engine.manifest, self.comm, threads or default_threads(self.comm))
        lim = engine.limits
        local = mapping.local_model(engine.model)
        # slot bookkeeping only: each rank's RankRunner holds its own heads' buffers
        self.kv = KVCacheManager(engine.model.num_layers, lim.max_batch, local.num_kv_heads, lim.max_seq_len,
                                 local.head_dim, engine.manifest.twin_dtype, host_buffers=False)
        self.vocab_size = engine.model.vocab_size
        self.max_input_len = lim.max_input_len
        self.execute_seconds = 0.0
        self._bound: tuple[int, np.ndarray] | None = None
        self._logits = np.zeros((0, self.vocab_size), np.float32)
        self._closed = False
        atexit.register(self.close)  # workers wait for STOP: a driver that exits without close() still sends it

    @property
    def collective_seconds(self) -> float:
        return self.runner.collective_seconds

    def bind(self, first_slot: int, input_ids: np.ndarray) -> None:
        self._bound = (first_slot, np.ascontiguousarray(input_ids, np.int64))

    def execute(self) -> None:
        assert self._bound is not None
        first, ids = self._bound
        rows, seq = ids.shape
        lengths = self.kv.lengths[first:first + rows].copy()
        started = time.perf_counter()
        self.comm.broadcast_ints(np.array([STEP, first, rows, seq]), HEADER)
        self.comm.broadcast_ints(np.concatenate([ids.reshape(-1), lengths]), rows * seq + rows)
        logits = self.runner.step(first, ids, lengths)
        assert logits is not None
        self._logits = logits
        self.execute_seconds += time.perf_counter() - started

    def read_logits(self) -> np.ndarray:
        return self._logits

    def _copy_rows(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        src, dst = list(src), list(dst)
        self.comm.broadcast_ints(np.array([COPY, len(src), length, 0]), HEADER)
        self.comm.broadcast_ints(np.array(src + dst), 2 * len(src))
        self.runner.copy_rows(src, dst, length)

    def zero_rows(self, slot: int, length: int) -> None:
        self.comm.broadcast_ints(np.array([ZERO, slot, length, 0]), HEADER)
        self.runner.zero_rows(slot, length)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.comm.broadcast_ints(np.array([STOP, 0, 0, 0]), HEADER)
        finally:
            self.runner.close()
            self.comm.close()
