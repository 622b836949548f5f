"""Decode steps replayed from CUDA graphs, one per batch-size bucket (TensorRT-LLM's and vLLM's way).

A small model's decode step is a few hundred kernels of microseconds each: launched one by one from Python it
is bound by the launches, not the GPU. A graph captured once per bucket replays the whole step with one call.
A step of n sequences runs the smallest bucket B >= n; rows n..B-1 are padding: no queries (query_start
repeats n), context length 0, block table all scratch, so their keys and values land in the scratch block and
their logits are dropped.

Everything the step reads lives in one static int64 device buffer (ids, positions, context lengths, query
starts, block tables): a step is one host-to-device copy from a pinned staging buffer, then the replay. Under
async scheduling some ids are the last step's samples, still on the device (ModelInput.device_tokens): the
buffer also carries where they go and where they come from, and one gather puts them in before the replay.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import numpy as np
import torch

from engine_builder.formats.graph_io import PagedKVLayout
from engine_builder.runner.core.model_input import ModelInput
from engine_builder.runner.kv.block_pool import SCRATCH_BLOCK
from engine_builder.runner.kv.paged_kv_cache import PagedKVCacheManager


class StepModel(Protocol):
    """What a graph captures: runtime.py's TorchRuntime."""

    device: torch.device
    layout: PagedKVLayout
    kv: PagedKVCacheManager

    def run_model(self, *args: Any, max_query_len: int) -> torch.Tensor: ...


def buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, every 32 past it, and max_batch itself."""
    out = [b for b in (1, 2, 4) if b < max_batch]
    out += list(range(8, min(max_batch, 64) + 1, 8)) + list(range(96, max_batch + 1, 32))
    return sorted({*[b for b in out if b <= max_batch], max_batch})


class DecodeInputs:
    """The static inputs of a decode step of `size` rows, packed in one int64 device buffer, and two host staging
    buffers (pinned on CUDA), used in turn: fill() writes a batch and its padding into one, one copy moves it.

    The copy is asynchronous, so a staging buffer is written again only once its last copy has run (an event). Two
    of them let a fill go ahead while the last step's copy still waits for the GPU: async scheduling fills step
    N+1 while step N, its copy included, may not have started."""

    def __init__(self, device: torch.device, size: int, width: int) -> None:
        self.size, self.width = size, width
        n = size * (6 + width) + 1
        self.buffer = torch.zeros(n, dtype=torch.int64, device=device)
        pinned = device.type == "cuda"
        self._staging = [torch.zeros(n, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self._copied: list[torch.cuda.Event | None] = [None, None]  # each staging buffer's last copy
        self._turn = 0
        b = self.buffer
        self.ids, self.positions, self.context_lens = b[:size], b[size:2 * size], b[2 * size:3 * size]
        self.query_start = b[3 * size:4 * size + 1]
        self.tables = b[4 * size + 1:(4 + width) * size + 1].view(size, width)
        self.gather = b[(4 + width) * size + 1:].view(2, size)  # device tokens: rows, and indices into the source
        self.rows = torch.arange(size, device=device)  # each row's token is its sequence's, and its logits' index

    def fill(self, batch: ModelInput, tables: np.ndarray) -> None:
        """Batch's n sequences in rows 0..n-1 (tables [n, width]), padding past them; then the copy (async on
        CUDA), and the ids still on the device (batch.device_tokens) gathered in."""
        staging, copied = self._staging[self._turn], self._copied[self._turn]
        if copied is not None:
            copied.synchronize()  # its last copy has run (at once, but for a step still queued two fills ago)
        n, s, h = batch.num_seqs, self.size, staging.numpy()
        h[:n], h[n:s] = batch.token_ids, 0
        h[s:s + n], h[s + n:2 * s] = batch.positions, 0
        h[2 * s:2 * s + n], h[2 * s + n:3 * s] = batch.context_lens, 0  # padding rows attend to nothing
        h[3 * s:3 * s + n + 1], h[3 * s + n + 1:4 * s + 1] = batch.query_start, n  # and have no queries
        end = (4 + self.width) * s + 1
        h[4 * s + 1:4 * s + 1 + n * self.width].reshape(n, self.width)[:] = tables
        h[4 * s + 1 + n * self.width:end] = SCRATCH_BLOCK  # their keys and values land in the scratch block
        taken = batch.device_tokens
        if taken is not None:
            h[end:end + len(taken.rows)], h[end + s:end + s + len(taken.rows)] = taken.rows, taken.index
        self.buffer.copy_(staging, non_blocking=True)
        if staging.is_pinned():
            self._copied[self._turn] = torch.cuda.Event()
            self._copied[self._turn].record()
        self._turn = 1 - self._turn
        if taken is not None:
            m = len(taken.rows)
            self.ids.index_copy_(0, self.gather[0, :m], taken.source.index_select(0, self.gather[1, :m]))

    def step(self, backend: StepModel) -> torch.Tensor:
        """The model over these inputs: logits [size, vocab]."""
        return backend.run_model(self.ids, self.positions, self.tables.to(torch.int32), self.context_lens,
                                 self.query_start, self.rows, self.rows, max_query_len=1)


class _Graph:
    """One captured decode step of `size` rows."""

    def __init__(self, backend: StepModel, size: int, pool) -> None:
        self.inputs = DecodeInputs(backend.device, size, backend.layout.max_blocks_per_seq)
        empty = ModelInput.decode(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        self.inputs.fill(empty, np.zeros((0, self.inputs.width), np.int64))  # all padding: writes hit scratch
        for _ in range(2):  # compile the kernels (Triton's first launch) and settle cuBLAS's workspaces
            self.inputs.step(backend)
        torch.cuda.synchronize(backend.device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = self.inputs.step(backend)  # [size, vocab]: valid until the next replay

    def run(self, batch: ModelInput, tables: np.ndarray) -> torch.Tensor:
        self.inputs.fill(batch, tables)
        self.graph.replay()
        return self.logits[:batch.num_seqs]


class DecodeGraphs:
    """The captured decode steps of one backend, each captured on first use of its bucket."""

    def __init__(self, backend: StepModel) -> None:
        self.backend = backend
        self.sizes = buckets(backend.kv.batch_slots)
        self._graphs: dict[int, _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle()  # one memory pool shared by every bucket's graph
        self.capture_seconds = 0.0

    def takes(self, batch: ModelInput) -> bool:
        """One token per sequence, each one's logits in order: a decode step."""
        n = batch.num_seqs
        return (batch.num_tokens == n and n <= self.sizes[-1]
                and bool((batch.logits_indices == np.arange(n)).all()))

    def run(self, batch: ModelInput) -> torch.Tensor:
        size = next(s for s in self.sizes if s >= batch.num_seqs)
        if size not in self._graphs:
            started = time.perf_counter()
            self._graphs[size] = _Graph(self.backend, size, self._pool)
            self.capture_seconds += time.perf_counter() - started
        return self._graphs[size].run(batch, self.backend.kv.block_table[batch.slots])

    def capture_all(self) -> float:
        """Capture every bucket now (a server's warm-up, before requests arrive); the seconds capturing took."""
        for size in self.sizes:
            if size not in self._graphs:
                started = time.perf_counter()
                self._graphs[size] = _Graph(self.backend, size, self._pool)
                self.capture_seconds += time.perf_counter() - started
        return self.capture_seconds
