"""Decode steps, and a lone sequence's short prefill, replayed from CUDA graphs (TensorRT-LLM's and vLLM's way).

A small model's step is a few hundred kernels of microseconds each: launched one by one from Python it is bound by
the launches, not the GPU. A graph captured once per bucket replays the whole step with one call.

    decode    n sequences of one token each run the smallest bucket of B >= n rows
    prefill   one sequence's query of q <= 256 tokens (a prefix-cache hit's tail, a short prompt, a chat turn),
              its last token's logits, runs the smallest bucket of T >= q tokens: on an H100 SmolLM2's 32-token
              prefill after a 992-token cached prefix was 3.0 ms of kernels and 36 ms launched eagerly

Padding (rows n..B-1, tokens q..T-1) belongs to a padding sequence: no queries (query start repeats the real
end), context length 0, block table all scratch, so its keys and values land in the scratch block and its logits
are dropped. A prefill bucket has two sequence rows, the real one and the padding one.

Everything the step reads lives in one static int64 device buffer (ids, positions, each token's sequence, the
logits' token indices, context lengths, query starts, block tables): a step is one host-to-device copy from a
pinned staging buffer, then the replay. Under async scheduling some ids are the last step's samples, still on
the device (ModelInput.device_tokens): the buffer also carries where they go and where they come from, and one
gather puts them in before the replay.
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
    max_input_len: int

    def run_model(self, *args: Any, max_query_len: int) -> torch.Tensor: ...


def buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to 64, every 32 past it, and max_batch itself."""
    out = [b for b in (1, 2, 4) if b < max_batch]
    out += list(range(8, min(max_batch, 64) + 1, 8)) + list(range(96, max_batch + 1, 32))
    return sorted({*[b for b in out if b <= max_batch], max_batch})


def prefill_buckets(max_input_len: int) -> list[int]:
    """Query lengths 16, 32, .. 256 (powers of two) up to max_input_len, and max_input_len itself if under 256 (none
    where a prefill is one token)."""
    out = [t for t in (16, 32, 64, 128, 256) if t < max_input_len]
    return sorted({*out, min(max_input_len, 256)}) if max_input_len > 1 else []


def step_bucket(batch: ModelInput, sizes: list[int], prefill_sizes: list[int]) -> tuple[str, int] | None:
    """The graph that runs BATCH: ("decode", rows) for one token per sequence, each one's logits in order;
    ("prefill", tokens) for one sequence's query wanting its last token's logits; None: an eager step."""
    n, q = batch.num_seqs, batch.num_tokens
    if q == n and n <= sizes[-1] and bool((batch.logits_indices == np.arange(n)).all()):
        return "decode", next(s for s in sizes if s >= n)
    if (prefill_sizes and n == 1 and 1 < q <= prefill_sizes[-1] and len(batch.logits_indices) == 1
            and batch.logits_indices[0] == q - 1 and batch.device_tokens is None):
        return "prefill", next(t for t in prefill_sizes if t >= q)
    return None


class StepInputs:
    """The static inputs of a step of `tokens` tokens over `seqs` sequence rows, packed in one int64 device buffer, and
    two host staging buffers (pinned on CUDA), used in turn: fill() writes a batch and its padding into one, one
    copy moves it.

    The copy is asynchronous, so a staging buffer is written again only once its last copy has run (an event). Two
    of them let a fill go ahead while the last step's copy still waits for the GPU: async scheduling fills step
    N+1 while step N, its copy included, may not have started."""

    def __init__(self, device: torch.device, tokens: int, seqs: int, width: int) -> None:
        self.tokens, self.seqs, self.width = tokens, seqs, width
        t, s = tokens, seqs
        # token region: ids, positions, each one's sequence row, the device tokens' gather (rows, source index);
        # sequence region: logits' token indices, context lengths, query starts (s + 1), block tables
        n = 5 * t + 3 * s + 1 + s * width
        self.buffer = torch.zeros(n, dtype=torch.int64, device=device)
        pinned = device.type == "cuda"
        self._staging = [torch.zeros(n, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self._copied: list[torch.cuda.Event | None] = [None, None]  # each staging buffer's last copy
        self._turn = 0
        b = self.buffer
        self.ids, self.positions, self.seq_of_token = b[:t], b[t:2 * t], b[2 * t:3 * t]
        self.gather = b[3 * t:5 * t].view(2, t)  # device tokens: rows, and indices into the source
        u = 5 * t
        self.logits_indices, self.context_lens = b[u:u + s], b[u + s:u + 2 * s]
        self.query_start = b[u + 2 * s:u + 3 * s + 1]
        self.tables = b[u + 3 * s + 1:].view(s, width)

    def fill(self, batch: ModelInput, tables: np.ndarray) -> None:
        """Batch's n sequences in rows 0..n-1 (tables [n, width]) and its q tokens first, padding past them (the last
        sequence row's, which must be padding when any token is); then the copy (async on CUDA), and the ids still on
        the device (batch.device_tokens) gathered in."""
        staging, copied = self._staging[self._turn], self._copied[self._turn]
        if copied is not None:
            copied.synchronize()  # its last copy has run (at once, but for a step still queued two fills ago)
        n, q, t, s, h = batch.num_seqs, batch.num_tokens, self.tokens, self.seqs, staging.numpy()
        h[:q], h[q:t] = batch.token_ids, 0
        h[t:t + q], h[t + q:2 * t] = batch.positions, 0
        h[2 * t:2 * t + q] = batch.seq_of_token
        h[2 * t + q:3 * t] = s - 1  # the padding sequence: its keys and values go to the scratch block
        taken = batch.device_tokens
        if taken is not None:
            m = len(taken.rows)
            h[3 * t:3 * t + m], h[4 * t:4 * t + m] = taken.rows, taken.index
        u = 5 * t
        h[u:u + len(batch.logits_indices)], h[u + len(batch.logits_indices):u + s] = batch.logits_indices, 0
        h[u + s:u + s + n], h[u + s + n:u + 2 * s] = batch.context_lens, 0  # padding rows attend to nothing
        h[u + 2 * s:u + 2 * s + n + 1], h[u + 2 * s + n + 1:u + 3 * s + 1] = batch.query_start, q  # and have no queries
        first = u + 3 * s + 1
        h[first:first + n * self.width].reshape(n, self.width)[:] = tables
        h[first + n * self.width:] = SCRATCH_BLOCK
        self.buffer.copy_(staging, non_blocking=True)
        if staging.is_pinned():
            self._copied[self._turn] = torch.cuda.Event()
            self._copied[self._turn].record()
        self._turn = 1 - self._turn
        if taken is not None:
            m = len(taken.rows)
            self.ids.index_copy_(0, self.gather[0, :m], taken.source.index_select(0, self.gather[1, :m]))

    def step(self, backend: StepModel, max_query_len: int) -> torch.Tensor:
        """The model over these inputs: logits [seqs, vocab] (one per sequence row)."""
        return backend.run_model(self.ids, self.positions, self.tables.to(torch.int32), self.context_lens,
                                 self.query_start, self.seq_of_token, self.logits_indices, max_query_len=max_query_len)


class _Graph:
    """One captured step of `tokens` tokens over `seqs` rows, every query at most max_query_len long."""

    def __init__(self, backend: StepModel, tokens: int, seqs: int, max_query_len: int, pool) -> None:
        self.inputs = StepInputs(backend.device, tokens, seqs, backend.layout.max_blocks_per_seq)
        empty = ModelInput.decode(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        self.inputs.fill(empty, np.zeros((0, self.inputs.width), np.int64))  # all padding: writes hit scratch
        for _ in range(2):  # compile the kernels (Triton's first launch) and settle cuBLAS's workspaces
            self.inputs.step(backend, max_query_len)
        torch.cuda.synchronize(backend.device)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.logits = self.inputs.step(backend, max_query_len)  # [seqs, vocab]: valid until the next replay

    def run(self, batch: ModelInput, tables: np.ndarray) -> torch.Tensor:
        self.inputs.fill(batch, tables)
        self.graph.replay()
        return self.logits[:len(batch.logits_indices)]


class StepGraphs:
    """The captured steps of one backend, each captured on first use of its bucket: decode steps by batch size
    (`sizes`), lone prefills by query length (`prefill_sizes`)."""

    def __init__(self, backend: StepModel) -> None:
        self.backend = backend
        self.sizes = buckets(backend.kv.batch_slots)
        self.prefill_sizes = prefill_buckets(backend.max_input_len)
        self._graphs: dict[tuple[str, int], _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle()  # one memory pool shared by every bucket's graph
        self.capture_seconds = 0.0

    @property
    def count(self) -> int:
        return len(self.sizes) + len(self.prefill_sizes)

    def bucket(self, batch: ModelInput) -> tuple[str, int] | None:
        return step_bucket(batch, self.sizes, self.prefill_sizes)

    def run(self, batch: ModelInput, key: tuple[str, int]) -> torch.Tensor:
        return self._graph(key).run(batch, self.backend.kv.block_table[batch.slots])

    def timed(self, key: tuple[str, int], replays: int = 20) -> tuple[_Graph, float]:
        """KEY's step over padding (the weights' work; no context is read) captured as a graph of its own, not a
        bucket (adopt_prefill makes a prefill one a bucket), then replayed: the graph, the median ms of a replay."""
        graph = self._new_graph(key)
        times = []
        for _ in range(replays + 3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return graph, float(np.median(times[3:]))  # the first replays warm the caches

    def adopt_prefill(self, tokens: int, graph: _Graph) -> None:
        """A timed lone prefill of TOKENS tokens from now on a bucket (past the default ones: runtime.py warm_up)."""
        self._graphs[("prefill", tokens)] = graph
        self.prefill_sizes = sorted({*self.prefill_sizes, tokens})

    def capture_all(self) -> float:
        """Capture every bucket now (a server's warm-up, before requests arrive); the seconds capturing took."""
        for key in [("decode", b) for b in self.sizes] + [("prefill", t) for t in self.prefill_sizes]:
            self._graph(key)
        return self.capture_seconds

    def _graph(self, key: tuple[str, int]) -> _Graph:
        if key not in self._graphs:
            self._graphs[key] = self._new_graph(key)
        return self._graphs[key]

    def _new_graph(self, key: tuple[str, int]) -> _Graph:
        started = time.perf_counter()
        kind, size = key
        # a decode bucket: SIZE rows of one token; a prefill bucket: SIZE tokens of one sequence, and the padding's
        graph = _Graph(self.backend, size, size, 1, self._pool) if kind == "decode" else \
            _Graph(self.backend, size, 2, size, self._pool)
        self.capture_seconds += time.perf_counter() - started
        return graph
