"""One rank of a tp/pp engine: its segments on onnxruntime, its KV cache, the collectives between.

A step (every rank runs it, the driver's command in hand):

    stage 0      x = all_reduce(embed(input_ids))                       vocab-parallel embedding
                 (later stages: x = recv from the previous stage's rank of the same tp rank)
    each layer   x = x + all_reduce(attn(x)); x = x + all_reduce(mlp(x))  partial sums of o_proj / down
    last stage   logits = all_gather(head(x))                            vocab-parallel lm_head
                 (then sent to rank 0, the driver, when it is not in the last stage)

With pp > 1 the rows are cut into micro-batches: stage s works on micro-batch j while stage s+1 works on
j-1 (sends are asynchronous), the pipeline schedule of GPipe's forward pass.
The residual adds happen here, in numpy, as transformers adds them (residual + branch, in the model dtype).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from engine_builder.formats import graph_io as io
from engine_builder.formats import parallel_mapping as pm
from engine_builder.formats.manifest import EngineManifest
from engine_builder.runner.kv.kv_cache import _kv_dtype
from engine_builder.runner.ort_backend import session_options
from engine_builder.runner.parallel.collectives import Collectives
from engine_builder.util.errors import UnsupportedError


def _session(path: Path, options: ort.SessionOptions, dtype: str) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/NotImplemented types
        raise UnsupportedError(f"onnxruntime {ort.__version__} cannot load {path}: {str(exc).splitlines()[0]}; "
                               f"its CPU kernels do not cover every {dtype} op: rebuild with --dtype float32 (or "
                               "twin_dtype float32) to run on CPU") from None


class RankRunner:
    def __init__(self, engine_dir: Path, manifest: EngineManifest, comm: Collectives, threads: int | None = None):
        mapping, cfg = manifest.mapping, manifest.model
        assert mapping is not None and cfg is not None
        self.mapping, self.comm, self.rank = mapping, comm, comm.rank
        self.stage = mapping.pp_rank(self.rank)
        self.last_stage = self.stage == mapping.pp - 1
        self.hidden_size = cfg.hidden_size
        self.vocab_size = cfg.vocab_size
        dtype = manifest.twin_dtype
        self.dtype = _kv_dtype(dtype)
        options = session_options(dtype, threads)
        # one thread pool per segment session (2 per layer): pools left spinning after their run would starve
        # the next segment's (measured: 48x slower decode steps with 2 threads per pool and spinning on)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.segments = mapping.segments(self.rank, cfg.num_layers)
        self.sessions = {s.name: _session(Path(engine_dir) / s.file(self.rank), options, dtype) for s in self.segments}
        local = mapping.local_model(cfg)
        lim = manifest.build.limits
        shape = (lim.max_batch, local.num_kv_heads, lim.max_seq_len, local.head_dim)  # per layer, this rank's heads
        self.keys = {i: np.zeros(shape, self.dtype) for i in mapping.layers(self.stage, cfg.num_layers)}
        self.values = {i: np.zeros(shape, self.dtype) for i in mapping.layers(self.stage, cfg.num_layers)}
        self.collective_seconds = 0.0  # wall time inside all-reduce / all-gather / send / recv

    # ---- one step -----------------------------------------------------------------------------------------
    def step(self, first: int, input_ids: np.ndarray, past_lengths: np.ndarray) -> np.ndarray | None:
        """Logits [rows, vocab] float32 of each row's last position on rank 0; None on the other ranks."""
        rows, seq = input_ids.shape
        chunks = self._micro_batches(rows)
        sends, logits = [], []
        prev = self.mapping.rank_of(self.comm.tp_rank, self.stage - 1) if self.stage else None
        nxt = self.mapping.rank_of(self.comm.tp_rank, self.stage + 1) if not self.last_stage else None
        for lo, hi in chunks:
            ids, lengths = input_ids[lo:hi], past_lengths[lo:hi]
            if prev is None:
                x = self._reduce(self._run("embed", {io.INPUT_IDS: ids})[0])
            else:
                x = self._timed(self.comm.recv, (hi - lo, seq, self.hidden_size), self.dtype, prev)
            positions = lengths[:, None] + np.arange(seq, dtype=np.int64)[None, :]
            for segment in self.segments:
                if segment.kind == "attn":
                    x = x + self._attention(segment, x, positions, lengths, first + lo, seq)
                elif segment.kind == "mlp":
                    x = x + self._reduce(self._run(segment.name, {pm.HIDDEN: x})[0])
            if nxt is not None:
                sends.append(self._timed(self.comm.isend, x, nxt))
            else:
                local = self._run("head", {pm.HIDDEN: x})[0][:, -1]  # [mb, vocab / tp]
                full = self._timed(self.comm.all_gather_last, local)  # [mb, vocab]
                if self.rank == 0:
                    logits.append(full)
                elif self.comm.tp_rank == 0:  # the last stage's first rank hands them to the driver
                    sends.append(self._timed(self.comm.isend, full, 0))
        if self.rank == 0 and not self.last_stage:
            source = self.mapping.rank_of(0, self.mapping.pp - 1)
            logits = [self._timed(self.comm.recv, (hi - lo, self.vocab_size), np.dtype(np.float32), source)
                      for lo, hi in chunks]
        for work, _ in sends:
            work.wait()
        return np.concatenate(logits) if self.rank == 0 else None

    def _attention(self, segment: pm.Segment, x: np.ndarray, positions: np.ndarray, lengths: np.ndarray,
                   first: int, seq: int) -> np.ndarray:
        i = segment.layer
        assert i is not None
        rows = x.shape[0]
        keys, values = self.keys[i][first:first + rows], self.values[i][first:first + rows]
        partial, present_key, present_value = self._run(segment.name, {
            pm.HIDDEN: x, io.POSITION_IDS: positions, io.PAST_LENGTHS: lengths,
            io.past_key(i): keys, io.past_value(i): values})
        for r in range(rows):  # the graph returns the whole buffer; only this step's positions are new
            s = int(lengths[r])
            keys[r, :, s:s + seq] = present_key[r, :, s:s + seq]
            values[r, :, s:s + seq] = present_value[r, :, s:s + seq]
        return self._reduce(partial)

    def _micro_batches(self, rows: int) -> list[tuple[int, int]]:
        count = min(rows, self.mapping.pp)  # one per stage keeps every stage busy; 1 without pp
        size = -(-rows // count)
        return [(lo, min(lo + size, rows)) for lo in range(0, rows, size)]

    def _run(self, name: str, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.sessions[name].run(None, feed)

    def _reduce(self, partial: np.ndarray) -> np.ndarray:
        return self._timed(self.comm.all_reduce, partial)

    def _timed(self, fn, *args):
        started = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.collective_seconds += time.perf_counter() - started

    # ---- cache maintenance the driver asks for -------------------------------------------------------------
    def copy_rows(self, src: list[int], dst: list[int], length: int) -> None:
        for cache in (*self.keys.values(), *self.values.values()):
            cache[dst, :, :length] = cache[src, :, :length]

    def zero_rows(self, slot: int, length: int) -> None:
        for cache in (*self.keys.values(), *self.values.values()):
            cache[slot, :, :length] = 0

    def close(self) -> None:
        self.sessions.clear()
