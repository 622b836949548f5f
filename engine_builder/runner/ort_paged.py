"""onnxruntime backend for a paged engine (`build --kv-layout paged`): block pools + block tables.

Every layer's kv_pool_key.{i} / kv_pool_value.{i} is the PagedKVCacheManager's pool array, bound by
address, and present_pool_* is bound over the same address: the graph's ScatterND then finds its output
already holding its input and writes only the new tokens (onnxruntime's ScatterND skips the copy when
input and output share a buffer), so nothing is copied back after a step. Each step binds
block_table [rows, width] with width = the blocks the step's longest row needs, so attention reads those
blocks only; the per-slot table is copied into a preallocated flat buffer (rows * width int64s).
Before a step, blocks about to be written that another sequence or the prefix tree maps are copied
(PagedKVCacheManager.prepare_write).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnxruntime as ort

from engine_builder.formats import graph_io as io
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.kv.paged_kv_cache import PagedKVCacheManager
from engine_builder.runner.ort_backend import _ORT_TYPES, OrtBackend, load_session
from engine_builder.util.errors import InputError


class PagedOrtBackend(OrtBackend):
    kv: PagedKVCacheManager  # type: ignore[assignment]

    def __init__(self, engine: EngineDir, *, threads: int | None = None,
                 optimization_level: ort.GraphOptimizationLevel | None = None,
                 kv_cache_memory: int | None = None, prefix_cache: bool = True) -> None:
        self.engine = engine
        engine.check_host_memory()  # sized before any allocation
        self.session = load_session(engine, threads, optimization_level)
        layout = self.layout = engine.twin_paged_layout
        _check_graph_pool(engine, {i.name: i for i in self.session.get_inputs()}, layout)
        lim = engine.limits
        self.kv_dtype = layout.dtype
        self.kv = PagedKVCacheManager.for_layout(layout, lim.max_batch, kv_cache_memory, prefix_cache)
        self.vocab_size = int(self.session.get_outputs()[0].shape[-1])
        self.max_input_len = lim.max_input_len
        meta = self.session.get_modelmeta().custom_metadata_map
        self.reprefill_after = io.reprefill_after(meta)
        self.all_logits = meta.get(io.META_ALL_LOGITS) == "true"
        self.logits_tail = io.logits_tail(meta)
        self.kv_update, self.kv_update_reason = "in_place", "paged pool: ScatterND over a pool bound as its own output"
        self._num_layers = layout.num_layers
        width = max(lim.max_batch * lim.max_input_len, int(layout.max_seq))
        self._ids = np.zeros(width, np.int64)
        self._pos = np.zeros(width, np.int64)
        self._arange = np.arange(width, dtype=np.int64)
        self._table = np.zeros(lim.max_batch * layout.max_blocks_per_seq, np.int64)  # [rows, width] bound
        tail = 1 if self.all_logits else self.logits_tail
        self._logits = np.zeros(lim.max_batch * tail * self.vocab_size, np.float32)
        self._present = None  # never copy mode: the pool is updated in place
        self._init_images(width)
        self._decode_bindings: dict[tuple[int, int, int], ort.IOBinding] = {}
        self._verify_bindings: dict = {}
        self._bound = None
        self.execute_seconds = 0.0

    def resize_kv(self, kv_cache_memory: int, prefix_cache: bool = True) -> None:
        """A new pool of kv_cache_memory bytes (before any request runs: every slot must be free)."""
        if self.kv.num_free != self.kv.batch_slots:
            raise InputError("the KV cache can be resized only while no request runs")
        self.kv = PagedKVCacheManager.for_layout(self.layout, self.kv.batch_slots, kv_cache_memory, prefix_cache)
        self._decode_bindings.clear()
        self._bound = None

    def bind(self, first_slot: int, input_ids: np.ndarray) -> None:
        rows, seq = input_ids.shape
        kv = self.kv
        kv.prepare_write(first_slot, rows, seq)
        n = rows * seq
        self._ids[:n] = input_ids.reshape(-1)
        lengths = kv.lengths[first_slot:first_slot + rows]
        positions = self._pos[:n].reshape(rows, seq)
        np.add(lengths[:, None], self._arange[None, :seq], out=positions)
        width = min(-(-(int(lengths.max()) + seq) // kv.block_size), self.layout.max_blocks_per_seq)
        table = self._table[:rows * width].reshape(rows, width)
        np.copyto(table, kv.block_table[first_slot:first_slot + rows, :width])
        if seq == 1:
            binding = self._decode_bindings.get((first_slot, rows, width))
            if binding is None:
                binding = self._decode_bindings[first_slot, rows, width] = self._bind_paged(first_slot, rows, 1,
                                                                                            width)
        else:
            binding = self._bind_paged(first_slot, rows, seq, width)
        self._bound = (binding, first_slot, rows, seq)

    def _bind_paged(self, first: int, rows: int, seq: int, width: int) -> ort.IOBinding:
        b = self.session.io_binding()
        b.bind_input(io.INPUT_IDS, "cpu", 0, np.int64, (rows, seq), self._ids.ctypes.data)
        b.bind_input(io.POSITION_IDS, "cpu", 0, np.int64, (rows, seq), self._pos.ctypes.data)
        b.bind_input(io.PAST_LENGTHS, "cpu", 0, np.int64, (rows,), self.kv.lengths[first:first + rows].ctypes.data)
        b.bind_input(io.BLOCK_TABLE, "cpu", 0, np.int64, (rows, width), self._table.ctypes.data)
        self._bind_image_inputs(b, rows, seq, 0)
        dtype = self.kv.dtype
        for i in range(self._num_layers):
            for past, present, pool in ((io.kv_pool_key(i), io.present_pool_key(i), self.kv.keys[i]),
                                        (io.kv_pool_value(i), io.present_pool_value(i), self.kv.values[i])):
                b.bind_input(past, "cpu", 0, dtype, pool.shape, pool.ctypes.data)
                b.bind_output(present, "cpu", 0, dtype, pool.shape, pool.ctypes.data)
        if self.all_logits:
            b.bind_output(io.LOGITS, "cpu")
        else:
            tail = min(seq, self.logits_tail)
            b.bind_output(io.LOGITS, "cpu", 0, np.float32, (rows, tail, self.vocab_size), self._logits.ctypes.data)
        return b

    def copy_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Beam fan-out and reordering: dst slots map src slots' blocks (copy-on-write), no KV is copied."""
        self.kv.copy_slots(src, dst)

    def _copy_rows(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        raise NotImplementedError("a paged cache forks blocks (copy_slots); it has no rows to copy")


def _check_graph_pool(engine: EngineDir, inputs: dict[str, ort.NodeArg], layout: io.PagedKVLayout) -> None:
    """model.onnx takes the pool its manifest describes (a dir mixed from two builds fails here, not mid-run)."""
    pools = [n for n in inputs if n.startswith("kv_pool_key.")]
    first = inputs.get(io.kv_pool_key(0))
    def fixed(shape) -> list:  # every dim but the dynamic block axis
        return [d for i, d in enumerate(shape) if i != io.POOL_BLOCK_AXIS]

    want = fixed(layout.pool_shape(0))
    if (len(pools) != layout.num_layers or first is None or io.BLOCK_TABLE not in inputs
            or fixed(first.shape) != want or _ORT_TYPES.get(first.type) != layout.dtype):
        graph = f"{len(pools)} layers of {fixed(first.shape)} {first.type}" if first is not None else "no kv_pool_key.0"
        raise InputError(f"{engine.onnx_path} takes a KV pool of {graph}, but its manifest describes a paged "
                         f"pool of {layout.num_layers} layers of {want} {layout.dtype}; the engine dir mixes two "
                         f"builds: rebuild it with `trtbuild build <ckpt-dir> {engine.path} --force`")


OrtBackend.layout_backends["paged"] = PagedOrtBackend
