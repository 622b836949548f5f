"""A tp engine dir on the torch backend: one TorchRuntime per rank, rank 0 driving the others (`--backend torch`).

Each rank runs the torch decoder over its own shard (rank{r}.safetensors) with its own paged pools (its KV heads
only) on its device: cuda:LOCAL_RANK with NCCL, the CPU with gloo (collectives.py picks). The decoder's
collectives (torch_backend/tensor_parallel.py) run inside its forward; what travels over the control group is
the driver's step, as for the onnxruntime ranks (parallel_backend.py's protocol, after [OPEN, TORCH, 0, 0]):

    [POOL, num_blocks, 0, 0]                         (re)allocate the pools: every rank the driver's block count
    [BLOCKS, n, 0, 0]      + src [n] + dst [n]        copy-on-write block copies (the KV manager's copy_blocks)
    [FORWARD, T, S, W]     + token_ids [T] + positions [T] + logits_indices [T] (-1 past the last)
                           + query_start [S + 1] + context_lens [S] + slots [S] + block tables [S * W]
    [STOP, 0, 0, 0]

Rank 0 alone keeps the KV bookkeeping (PagedKVCacheManager: admission, growth, prefix reuse, forks) and sends
each step the block tables of its sequences; a follower keeps only a copy of those rows (BlockTables), which is
what the decode graphs and the eager step read. pp > 1 is refused: the torch backend runs tensor parallel only.

On CUDA every rank replays decode steps from CUDA graphs with the collectives inside (NCCL >= 2.9.6 captures
them): the same batches reach every rank, so each captures a bucket at the same step, after that bucket's two
eager warm-up steps (cuda_graphs.py) have run its collectives outside any capture. Not yet run on GPUs (issue 37).
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Sequence

import numpy as np
import torch

from engine_builder.runner.backend import WarmUp
from engine_builder.runner.core.model_input import ModelInput
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.kv.block_pool import SCRATCH_BLOCK
from engine_builder.runner.parallel.collectives import Collectives
from engine_builder.runner.parallel.parallel_backend import HEADER, OPEN, STOP, TORCH, default_threads
from engine_builder.runner.torch_backend.device import device_memory_budget
from engine_builder.runner.torch_backend.registered import torch_verdict
from engine_builder.runner.torch_backend.runtime import TorchRuntime
from engine_builder.runner.torch_backend.tensor_parallel import TensorParallel
from engine_builder.util.errors import UnsupportedError

POOL, BLOCKS, FORWARD = 5, 6, 7  # after OPEN TORCH (parallel_backend.py's ops are 0-4)


def tensor_parallel(comm: Collectives) -> TensorParallel:
    return TensorParallel(comm.mapping.tp, comm.tp_rank, comm.tp_group)


class TorchParallelBackend(TorchRuntime):
    """Rank 0's Backend: the ordinary TorchRuntime (its shard, its pools, the KV bookkeeping of every rank), each
    pool change and step sent to the followers first."""

    title = "PyTorch tp ranks"
    takes_device_tokens = False  # the followers are sent the step's token ids from the host, never device ones

    def warm_up(self, progress: Callable[[str], None] | None = None) -> WarmUp | None:
        """Nothing ahead: the warm-up's steps and captures would run rank 0's collectives with no follower
        stepping (a hang); the ranks compile and capture together at their first steps instead."""
        return None

    @classmethod
    def open(cls, engine: EngineDir, *, threads: int | None = None) -> TorchParallelBackend:
        return cls(engine, threads=threads)

    def __init__(self, engine: EngineDir, *, threads: int | None = None, kv_cache_memory: int | None = None,
                 comm: Collectives | None = None) -> None:
        mapping = engine.manifest.mapping
        assert mapping is not None
        engine.check_host_memory()  # before joining the other ranks, as they check too (worker.py)
        self.comm = comm or Collectives(mapping)
        if self.comm.rank != 0:
            raise AssertionError("TorchParallelBackend runs on rank 0; other ranks run worker.follow()")
        self._closed = False
        ok, verdict = torch_verdict(engine.manifest, engine.path, asked=True)
        if not ok:  # refused after joining: the followers return at once on STOP rather than wait for rank 0
            self.close()
            raise UnsupportedError(f"cannot run {engine.path} on the PyTorch backend: {verdict}")
        self.comm.broadcast_ints(np.array([OPEN, TORCH, 0, 0]), HEADER)
        try:
            super().__init__(engine, threads=threads or default_threads(self.comm), kv_cache_memory=kv_cache_memory,
                             tp=tensor_parallel(self.comm), device=self.comm.device)
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)  # followers wait for STOP: a driver that exits without close() still sends it

    @property
    def reason(self) -> str:
        """Why and how it runs (LLM.backend_reason)."""
        where = f"{self.device.type} ({self.dtype})".replace("torch.", "")
        return (f"tp={self.comm.mapping.tp} pp=1: each rank's decoder on PyTorch, {where}, collectives over "
                f"{self.comm.backend} between")

    def _new_pool(self, kv_cache_memory: int | None, prefix_cache: bool) -> None:
        if kv_cache_memory is None and self.device.type == "cpu":  # this host's RAM holds every local rank's pool
            kv_cache_memory = device_memory_budget(self.device) // self.comm.env.local_world_size
        super()._new_pool(kv_cache_memory, prefix_cache)

    def _allocate_pools(self, num_blocks: int) -> None:
        self.comm.broadcast_ints(np.array([POOL, num_blocks, 0, 0]), HEADER)
        super()._allocate_pools(num_blocks)

    def _copy_blocks(self, src: Sequence[int], dst: Sequence[int]) -> None:
        self.comm.broadcast_ints(np.array([BLOCKS, len(src), 0, 0]), HEADER)
        self.comm.broadcast_ints(np.array([*src, *dst]), 2 * len(src))
        super()._copy_blocks(src, dst)

    def _step(self, batch: ModelInput) -> torch.Tensor:
        t, s = batch.num_tokens, batch.num_seqs
        if len(batch.logits_indices) > t:
            raise AssertionError(f"{len(batch.logits_indices)} logits of {t} tokens: the step protocol sends at most "
                                 "one per token")
        width = max(1, -(-int(batch.context_lens.max()) // self.layout.block_size))
        indices = np.full(t, -1, np.int64)
        indices[:len(batch.logits_indices)] = batch.logits_indices
        payload = np.concatenate([batch.token_ids, batch.positions, indices, batch.query_start, batch.context_lens,
                                  batch.slots, self.kv.block_table[batch.slots, :width].reshape(-1)])
        self.comm.broadcast_ints(np.array([FORWARD, t, s, width]), HEADER)
        self.comm.broadcast_ints(payload, len(payload))
        return super()._step(batch)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.comm.broadcast_ints(np.array([STOP, 0, 0, 0]), HEADER)
        except RuntimeError:  # gloo / NCCL: the followers are gone already (a signal to the whole process group)
            pass
        finally:
            if hasattr(self, "keys"):
                super().close()
            self.comm.close()


class BlockTables:
    """A follower's copy of the driver's block table rows, as each step sends them: what TorchRuntime reads of its
    KV manager to run a step (block_table, batch_slots)."""

    def __init__(self, batch_slots: int, max_blocks: int) -> None:
        self.batch_slots = batch_slots
        self.block_table = np.full((batch_slots, max_blocks), SCRATCH_BLOCK, np.int64)

    def set_rows(self, slots: np.ndarray, rows: np.ndarray) -> None:
        """rows [len(slots), width]: those slots' first blocks; past them, scratch (never read past a context)."""
        self.block_table[slots, :rows.shape[1]] = rows
        self.block_table[slots, rows.shape[1]:] = SCRATCH_BLOCK


class TorchRank(TorchRuntime):
    """A follower's decoder and pools; the pool size and block tables are the driver's."""

    kv: BlockTables  # type: ignore[assignment]

    def _new_pool(self, kv_cache_memory: int | None, prefix_cache: bool) -> None:
        self.kv = BlockTables(self.engine.limits.max_batch, self.layout.max_blocks_per_seq)
        self.keys = self.values = []  # until the driver's POOL
        self._graphs = None

    def new_pools(self, num_blocks: int) -> None:
        self.keys = self.values = []
        self._graphs = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the old pools' memory back before the new ones take it
        self._allocate_pools(num_blocks)


class TorchFollower:
    """worker.py's Follower for OPEN TORCH: this rank's TorchRank, stepped by the driver's commands."""

    def __init__(self, engine: EngineDir, comm: Collectives, threads: int) -> None:
        self.comm = comm
        self.rank = TorchRank(engine, threads=threads, tp=tensor_parallel(comm), device=comm.device)

    def command(self, op: int, a: int, b: int, c: int) -> bool:
        if op == FORWARD:
            self._forward(a, b, c)
            return True
        if op == BLOCKS:  # a = n
            pairs = self.comm.broadcast_ints(None, 2 * a)
            self.rank._copy_blocks(pairs[:a].tolist(), pairs[a:].tolist())
        elif op == POOL:  # a = num_blocks
            self.rank.new_pools(a)
        else:
            raise RuntimeError(f"unknown driver command {op} for a torch rank")
        return False

    def _forward(self, t: int, s: int, width: int) -> None:
        payload = self.comm.broadcast_ints(None, 3 * t + 3 * s + 1 + s * width)
        ids, positions, indices = payload[:t], payload[t:2 * t], payload[2 * t:3 * t]
        rest = payload[3 * t:]
        query_start, context_lens, slots = rest[:s + 1], rest[s + 1:2 * s + 1], rest[2 * s + 1:3 * s + 1]
        self.rank.kv.set_rows(slots, rest[3 * s + 1:].reshape(s, width))
        batch = ModelInput(token_ids=ids, positions=positions, query_start=query_start, context_lens=context_lens,
                           slots=slots, logits_indices=indices[indices >= 0])
        self.rank._step(batch)  # every rank's collectives; the logits are rank 0's to sample

    def close(self) -> None:
        self.rank.close()
