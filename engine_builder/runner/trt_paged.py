"""TensorRT backend for a paged engine (`build --kv-layout paged`): block pools on the GPU + block tables.

Every layer's kv_pool_key.{i} / kv_pool_value.{i} is one device tensor [kv_heads, num_blocks, B, head_dim]
(formats/graph_io.py) bound whole at its base address, as is block_table [rows, width] (width = the
blocks the step's longest row needs, as on onnxruntime). The bookkeeping is the same PagedKVCacheManager
the onnxruntime twin uses (host_buffers=False: no host pool), whose copy-on-write copies run here, on the
device (copy_blocks). The same documented calls as the slot layout (trt_backend.py): set_input_shape and
set_tensor_address for every input, set_tensor_address for every output, execute_async_v3.

The write is a ScatterND, which TensorRT does not alias to its input (only KV_CACHE_UPDATE updates in place,
shared/DESIGN.md §4): present_pool_* is then a whole new pool. Unless the engine reports an alias
(get_aliased_input_tensor), each layer gets two pools and they swap roles after every step (ping-pong):
the step reads one and writes the other, and nothing is copied back; the cost is the engine's own copy
of the pool into its output, measured in README's paged section as the reason this path is slower.

Nothing below the verdict check runs on a machine without a supported GPU: the shapes, the binding plan and
the check of the engine's pool against the manifest are plain functions, tested without one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from engine_builder.formats import graph_io as io
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.kv.paged_kv_cache import PagedKVCacheManager
from engine_builder.runner.trt_backend import _TORCH_DTYPES, Binding, Shape, TrtBackend, apply_plan, select_profile
from engine_builder.runner.tunables import TRT_POOL_MEMORY_FRACTION
from engine_builder.util.errors import InputError

_POOL_DTYPES = {**_TORCH_DTYPES, "INT8": "int8"}  # TensorRT DataType names -> the layout's dtype names


def trt_paged_layout(engine: EngineDir) -> io.PagedKVLayout:
    """The pool rank0.engine takes: the engine's dtype (the twin's may be float32)."""
    kv_cache = engine.manifest.checkpoint_quantization.kv_cache
    return io.PagedKVLayout.of(engine.model, engine.limits.max_seq_len, engine.dtype, kv_cache,
                               engine.manifest.build.kv_block_size)


def check_engine_pool(engine: EngineDir, shape: Sequence[int], dtype: str, layout: io.PagedKVLayout) -> None:
    """The engine's kv_pool_key.0 (its dims, -1 where dynamic, and its dtype) is the manifest's pool: a dir
    mixed from two builds fails here, before any device memory is taken."""
    want = list(layout.pool_shape(-1))
    if list(shape) != want or dtype != layout.dtype:
        raise InputError(f"{engine.engine_path} takes a KV pool {list(shape)} {dtype}, but its manifest describes "
                         f"{want} {layout.dtype}; the engine dir mixes two builds: rebuild it with "
                         f"`trtbuild build <ckpt-dir> {engine.path} --force`")


def paged_input_shapes(rows: int, seq: int, width: int, num_layers: int, pool_shape: Shape) -> dict[str, Shape]:
    """Runtime shape of every engine input for a step of [rows, seq] tokens reading `width` blocks per row."""
    shapes: dict[str, Shape] = {io.INPUT_IDS: (rows, seq), io.POSITION_IDS: (rows, seq), io.PAST_LENGTHS: (rows,),
                                io.BLOCK_TABLE: (rows, width)}
    for i in range(num_layers):
        shapes[io.kv_pool_key(i)] = shapes[io.kv_pool_value(i)] = pool_shape  # the whole pool: any row, any block
    return shapes


def paged_binding_plan(rows: int, seq: int, width: int, num_layers: int, pool_shape: Shape,
                       address_of: Callable[[str], int], aliased: Mapping[str, str]) -> list[Binding]:
    """Every tensor of one step with its address. address_of(name) gives each buffer's address (for
    present_pool_* the pool the step writes, the other one of its ping-pong pair); an output TensorRT aliases
    to an input (aliased: output -> input) gets that input's address instead (in place)."""
    plan = [Binding(name, shape, address_of(name))
            for name, shape in paged_input_shapes(rows, seq, width, num_layers, pool_shape).items()]
    by_name = {b.name: b.address for b in plan}
    plan.append(Binding(io.LOGITS, None, address_of(io.LOGITS)))
    for i in range(num_layers):
        for out in (io.present_pool_key(i), io.present_pool_value(i)):
            source = aliased.get(out)
            plan.append(Binding(out, None, by_name[source] if source else address_of(out)))
    return plan


def step_width(lengths: np.ndarray, seq: int, block_size: int, max_blocks: int) -> int:
    """Block-table columns a step needs: the blocks of its longest row after this step's tokens."""
    return min(-(-(int(lengths.max()) + seq) // block_size), max_blocks)


class TrtPagedBackend(TrtBackend):
    kv: PagedKVCacheManager  # type: ignore[assignment]

    def _init_kv(self, engine: EngineDir, names: list[str], torch: Any) -> None:
        e, lim = self.trt_engine, engine.limits
        self.layout, self._max_batch = trt_paged_layout(engine), lim.max_batch
        check_engine_pool(engine, [int(d) for d in e.get_tensor_shape(io.kv_pool_key(0))],
                          _POOL_DTYPES.get(e.get_tensor_dtype(io.kv_pool_key(0)).name, "?"), self.layout)
        self._num_layers = sum(n.startswith("kv_pool_key.") for n in names)
        pairs = range(self._num_layers)
        self.kv_update = "in_place" if all(io.present_pool_key(i) in self.aliased for i in pairs) else "ping_pong"
        self._kv_dtype = getattr(torch, self.layout.dtype)
        self._cache, self._present = {}, {}  # the slot layout's buffers: none here
        self._table = torch.zeros(lim.max_batch * self.layout.max_blocks_per_seq, dtype=torch.int64, device="cuda")
        self._table_host = torch.zeros(self._table.numel(), dtype=torch.int64).pin_memory()
        free, _ = torch.cuda.mem_get_info()
        copies = 1 if self.kv_update == "in_place" else 2
        self._make_pools(int(free * TRT_POOL_MEMORY_FRACTION) // copies, prefix_cache=True)

    def _make_pools(self, kv_cache_memory: int, prefix_cache: bool) -> None:
        """A pool of kv_cache_memory bytes per copy (two copies when ping-pong)."""
        torch = self._torch
        self.kv = PagedKVCacheManager.for_layout(self.layout, self._max_batch, kv_cache_memory,
                                                 prefix_cache, host_buffers=False)
        self.kv.pool.copy_blocks = self._copy_blocks
        shape = self.layout.pool_shape(self.kv.pool.num_blocks)
        names = [n for i in range(self._num_layers) for n in (io.kv_pool_key(i), io.kv_pool_value(i))]
        copies = 1 if self.kv_update == "in_place" else 2
        self._pools = [{n: torch.zeros(shape, dtype=self._kv_dtype, device="cuda") for n in names}
                       for _ in range(copies)]
        self._current = 0  # the pool set the next step reads
        self._pool_shape = tuple(int(d) for d in shape)
        self._bound_key = [None] * len(getattr(self, "contexts", ()))

    def resize_kv(self, kv_cache_memory: int, prefix_cache: bool = True) -> None:
        """New pools of kv_cache_memory bytes (each, when ping-pong), before any request runs."""
        if self.kv.num_free != self.kv.batch_slots:
            raise InputError("the KV cache can be resized only while no request runs")
        self._make_pools(kv_cache_memory, prefix_cache)

    def _address(self, name: str, first: int = 0) -> int:
        if name.startswith("kv_pool_"):
            return self._pools[self._current][name].data_ptr()
        if name.startswith("present_pool_"):  # the other set (ping-pong); in place, aliased before this is asked
            return self._pools[-1 - self._current][name.replace("present_pool_", "kv_pool_")].data_ptr()
        if name == io.BLOCK_TABLE:
            return self._table.data_ptr()
        return super()._address(name, first)

    def bind(self, first_slot: int, input_ids: np.ndarray) -> None:
        rows, seq = input_ids.shape
        kv = self.kv
        kv.prepare_write(first_slot, rows, seq)  # blocks for the new tokens; shared ones copied (on the device)
        self._stage(first_slot, input_ids)
        width = step_width(kv.lengths[first_slot:first_slot + rows], seq, kv.block_size,
                           self.layout.max_blocks_per_seq)
        table = self._table_host.numpy()[:rows * width].reshape(rows, width)
        np.copyto(table, kv.block_table[first_slot:first_slot + rows, :width])
        with self._torch.cuda.stream(self.stream):
            self._table[:rows * width].copy_(self._table_host[:rows * width], non_blocking=True)
        profile = select_profile(self.profiles, rows, seq)
        key = (first_slot, rows, seq, width, self._current)
        if self._bound_key[profile] != key:
            apply_plan(self.contexts[profile], paged_binding_plan(rows, seq, width, self._num_layers,
                                                                  self._pool_shape, self._address, self.aliased))
            self._bound_key[profile] = key
        self._step = (profile, first_slot, rows, seq)

    def execute(self) -> None:
        super().execute()
        if self.kv_update == "ping_pong":  # the step wrote the whole updated pool into the other set
            self._current = 1 - self._current

    def _copy_blocks(self, src: Sequence[int], dst: Sequence[int]) -> None:
        torch = self._torch
        s, d = torch.as_tensor(list(src), device="cuda"), torch.as_tensor(list(dst), device="cuda")
        with torch.cuda.stream(self.stream):
            for pool in self._pools[self._current].values():  # [kv_heads, num_blocks, B, head_dim]
                pool[:, d] = pool[:, s]
        self.stream.synchronize()

    def copy_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Beam fan-out and reordering: dst slots map src slots' blocks (copy-on-write), no KV is copied."""
        self.kv.copy_slots(src, dst)

    def _copy_rows(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        raise NotImplementedError("a paged cache forks blocks (copy_slots); it has no rows to copy")

    def zero_rows(self, slot: int, length: int) -> None:
        """Nothing to zero: a freed block keeps finite values, which the mask hides from its next holder."""

    def close(self) -> None:
        super().close()
        self._pools = []


TrtBackend.layout_backends["paged"] = TrtPagedBackend
