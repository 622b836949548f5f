"""TensorRT / TensorRT-RTX backend: rank0.engine on a GPU, driven through execute_async_v3.

Thin on purpose (DESIGN §4): our build hosts have no GPU, so nothing below `TrtBackend.__init__`'s
verdict check runs in CI. The parts that can be checked without a GPU are plain functions over
plain data (profile choice, input shapes, the binding plan) and are unit-tested with fake
contexts; the CUDA side uses only documented TensorRT 10 / TensorRT-RTX 1.x calls:

    Runtime(logger).deserialize_cuda_engine(bytes)
    engine.create_execution_context(ExecutionContextAllocationStrategy.USER_MANAGED)
    context.set_device_memory(ptr, size)         one scratch buffer shared by both contexts
    context.set_optimization_profile_async(p, stream)
    context.set_input_shape(name, shape); context.set_tensor_address(name, ptr)
    context.execute_async_v3(stream)
    engine.get_tensor_profile_shape(name, p); engine.get_aliased_input_tensor(name)

Profiles come from build.py's `trt_profiles`: 0 = decode (seq 1, gemv attention kernels), then verify
(seq 2..logits_tail, when built with one: speculative decoding's k+1-token steps), last prefill
(seq 2..max_input_len). Each profile gets its own execution context, bound once
per (profile, first slot, rows, seq) and reused while that stays the same, so a decode step is
three small host->device copies, one enqueue and one logits copy back. Steps are serialized on
one stream, so the contexts can share one device scratch buffer (TensorRT-LLM does the same).

Device buffers are torch CUDA tensors (torch is already a dependency; no pycuda / cuda-python).
The KV cache is one [max_batch, kv_heads, max_seq, head_dim] tensor per layer and K/V; TensorRT's
KV_CACHE_UPDATE layer requires present_* to share past_*'s address (get_aliased_input_tensor
names the pair), which makes the update in place. An engine without aliasing gets separate
present buffers and, as on onnxruntime, only the new positions are copied back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine_builder.formats import graph_io as io
from engine_builder.runner.backend import Backend, register_backend
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.kv.kv_cache import KVCacheManager
from engine_builder.trt import compat as trt_compat
from engine_builder.util.errors import CapacityError, UnsupportedError

Shape = tuple[int, ...]
Profile = Mapping[str, tuple[Shape, Shape, Shape]]  # input name -> (min, opt, max)
_TORCH_DTYPES = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT64": "int64", "INT32": "int32"}


# --- plain logic (no GPU) ---------------------------------------------------------------------

def profiles_from_manifest(tensorrt: Mapping[str, Any]) -> list[dict[str, tuple[Shape, Shape, Shape]]]:
    """The profiles build.py recorded in the manifest, as tuples (same data the engine reports)."""
    return [{name: tuple(tuple(int(d) for d in s) for s in shapes) for name, shapes in p.items()}
            for p in tensorrt.get("profiles", [])]


def select_profile(profiles: Sequence[Profile], rows: int, seq: int) -> int:
    """First profile whose input_ids range holds [rows, seq]: decode (seq 1) before prefill."""
    for index, profile in enumerate(profiles):
        lo, _, hi = profile[io.INPUT_IDS]
        if lo[0] <= rows <= hi[0] and lo[1] <= seq <= hi[1]:
            return index
    ranges = ", ".join(f"profile {i}: rows {p[io.INPUT_IDS][0][0]}..{p[io.INPUT_IDS][2][0]}, "
                       f"seq {p[io.INPUT_IDS][0][1]}..{p[io.INPUT_IDS][2][1]}" for i, p in enumerate(profiles))
    raise CapacityError(f"no optimization profile of the engine takes {rows} rows x {seq} tokens ({ranges}); "
                        "shorten the prompt or rebuild with larger limits")


def input_shapes(rows: int, seq: int, num_layers: int, kv_shape: Shape) -> dict[str, Shape]:
    """Runtime shape of every engine input for a step of [rows, seq] tokens."""
    shapes: dict[str, Shape] = {io.INPUT_IDS: (rows, seq), io.POSITION_IDS: (rows, seq), io.PAST_LENGTHS: (rows,)}
    for i in range(num_layers):
        shapes[io.past_key(i)] = shapes[io.past_value(i)] = (rows, *kv_shape)  # [rows, kv_heads, max_seq, head_dim]
    return shapes


@dataclass(frozen=True)
class Binding:
    name: str
    shape: Shape | None  # inputs only: what set_input_shape gets
    address: int


def binding_plan(first: int, rows: int, seq: int, num_layers: int, kv_shape: Shape,
                 address_of: Callable[[str, int], int], aliased: Mapping[str, str]) -> list[Binding]:
    """Every tensor of one step with its address. address_of(name, first_row) gives a buffer's
    address at row `first` (the flat id/position/logit buffers ignore the row); an output that
    TensorRT aliases to an input (aliased: output -> input) gets that input's address."""
    plan = [Binding(name, shape, address_of(name, first))
            for name, shape in input_shapes(rows, seq, num_layers, kv_shape).items()]
    by_name = {b.name: b.address for b in plan}
    plan.append(Binding(io.LOGITS, None, address_of(io.LOGITS, first)))
    for i in range(num_layers):
        for out in (io.present_key(i), io.present_value(i)):
            source = aliased.get(out)
            plan.append(Binding(out, None, by_name[source] if source else address_of(out, first)))
    return plan


def apply_plan(context: Any, plan: Sequence[Binding]) -> None:
    for b in plan:
        if b.shape is not None and not context.set_input_shape(b.name, b.shape):
            raise CapacityError(f"the TensorRT engine rejects shape {b.shape} for {b.name}; "
                                "it is outside the engine's optimization profile")
        if not context.set_tensor_address(b.name, b.address):
            raise RuntimeError(f"TensorRT refused the address of {b.name}")


# --- the GPU side -----------------------------------------------------------------------------

@register_backend(preference=10)
class TrtBackend(Backend):
    name = "tensorrt"
    title = "TensorRT"

    @classmethod
    def usable(cls, engine: EngineDir) -> tuple[bool, str]:
        """compatibility_verdict for the engine dir's rank0.engine, or why there is none."""
        if not engine.tensorrt or "tensorrt" not in engine.targets:
            return False, "the engine dir was built without the tensorrt target"
        from engine_builder.trt.compatibility import compatibility_verdict

        return compatibility_verdict(engine.tensorrt, engine_path=engine.engine_path)

    # another KV layout's subclass, by EngineDir.kv_layout_kind (paged: runner/trt_paged.py registers itself)
    layout_backends: dict[str, type[TrtBackend]] = {}

    @classmethod
    def open(cls, engine: EngineDir, *, threads: int | None = None) -> TrtBackend:
        return cls.layout_backends.get(engine.kv_layout_kind, cls)(engine)

    def __init__(self, engine: EngineDir, *, verdict: tuple[bool, str] | None = None) -> None:
        ok, reason = self.usable(engine) if verdict is None else verdict
        if not ok:  # decided from the manifest and the host before touching CUDA
            raise UnsupportedError(f"cannot run the TensorRT engine in {engine.path}: {reason}; use "
                                   "--backend onnxruntime (or auto) to run its ONNX twin on CPU")
        import torch

        if not torch.cuda.is_available():
            raise UnsupportedError("cannot run here: this torch build has no CUDA; install a CUDA build of torch "
                                   "or use --backend onnxruntime")
        self._torch = torch
        trt = trt_compat.load_trt(engine.tensorrt["flavour"])
        self._runtime = trt.Runtime(trt_compat.make_logger(trt))
        self.trt_engine = self._runtime.deserialize_cuda_engine(engine.engine_path.read_bytes())
        if self.trt_engine is None:
            raise UnsupportedError(f"{trt_compat.describe(trt)} could not deserialize {engine.engine_path}; "
                                   "rebuild the engine for this GPU and TensorRT version")
        e, lim = self.trt_engine, engine.limits
        names = [e.get_tensor_name(i) for i in range(e.num_io_tensors)]
        self.vocab_size = int(e.get_tensor_shape(io.LOGITS)[-1])
        self.profiles = [{n: tuple(tuple(int(d) for d in s) for s in e.get_tensor_profile_shape(n, p))
                          for n in names if e.get_tensor_mode(n) == trt.TensorIOMode.INPUT}
                         for p in range(e.num_optimization_profiles)]
        self.max_input_len = max(p[io.INPUT_IDS][2][1] for p in self.profiles)
        meta = engine.graph_metadata  # the same decoder as the twin: its longrope switch applies here too
        self.reprefill_after = io.reprefill_after(meta)
        self.logits_tail = min(io.logits_tail(meta), self.max_input_len)
        self.aliased = {n: a for n in names if e.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT
                        and (a := e.get_aliased_input_tensor(n))}
        self._init_kv(engine, names, torch)

        cuda = torch.device("cuda")
        width = max(lim.max_batch * self.max_input_len, lim.max_seq_len)
        self._ids = torch.zeros(width, dtype=torch.int64, device=cuda)
        self._pos = torch.zeros(width, dtype=torch.int64, device=cuda)
        self._lengths = torch.zeros(lim.max_batch, dtype=torch.int64, device=cuda)
        logits_size = lim.max_batch * self.logits_tail * self.vocab_size  # [rows, min(seq, tail), vocab]
        self._logits = torch.zeros(logits_size, dtype=torch.float32, device=cuda)
        # pinned host staging, so the copies are asynchronous on our stream
        self._ids_host = torch.zeros(width, dtype=torch.int64).pin_memory()
        self._pos_host = torch.zeros(width, dtype=torch.int64).pin_memory()
        self._lengths_host = torch.zeros(lim.max_batch, dtype=torch.int64).pin_memory()
        self._logits_host = torch.zeros(logits_size, dtype=torch.float32).pin_memory()
        self._arange = np.arange(width, dtype=np.int64)

        self.stream = torch.cuda.Stream()
        size = max(e.get_device_memory_size_for_profile_v2(p) for p in range(len(self.profiles)))
        self._scratch = torch.empty(max(size, 1), dtype=torch.uint8, device=cuda)
        self.contexts = []
        for p in range(len(self.profiles)):
            context = e.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
            context.set_device_memory(self._scratch.data_ptr(), size)
            if not context.set_optimization_profile_async(p, self.stream.cuda_stream):
                raise UnsupportedError(f"TensorRT refused optimization profile {p} of {engine.engine_path}")
            self.contexts.append(context)
        self.stream.synchronize()
        self._bound_key: list[tuple[int, ...] | None] = [None] * len(self.contexts)
        self._step: tuple[int, int, int, int] | None = None  # profile, first, rows, seq
        self.execute_seconds = 0.0

    def _init_kv(self, engine: EngineDir, names: list[str], torch: Any) -> None:
        """The slot layout's KV: one [max_batch, kv_heads, max_seq, head_dim] device tensor per layer and K/V
        (a paged engine's block pools: trt_paged.py)."""
        e, lim = self.trt_engine, engine.limits
        num_layers = sum(n.startswith("past_key.") for n in names)
        kv_shape = tuple(int(d) for d in e.get_tensor_shape(io.past_key(0)))[1:]  # [kv_heads, max_seq, head_dim]
        self._num_layers, self._kv_shape = num_layers, kv_shape
        self.kv_update = "in_place" if all(io.present_key(i) in self.aliased for i in range(num_layers)) else "copy"
        kv_dtype = getattr(torch, _TORCH_DTYPES[e.get_tensor_dtype(io.past_key(0)).name])
        self.kv = KVCacheManager.for_layout(engine.kv_layout, lim.max_batch, host_buffers=False)
        shape = (lim.max_batch, *kv_shape)  # [slots, kv_heads, max_seq, head_dim]
        self._cache = {n: torch.zeros(shape, dtype=kv_dtype, device="cuda")
                       for i in range(num_layers) for n in (io.past_key(i), io.past_value(i))}
        self._present = {} if self.kv_update == "in_place" else {
            n.replace("past_", "present_"): torch.zeros_like(t) for n, t in self._cache.items()}

    def _address(self, name: str, first: int) -> int:
        if name in self._cache:
            return self._cache[name][first].data_ptr()  # row `first` of [slots, ...]: contiguous rows after it
        if name in self._present:
            return self._present[name][first].data_ptr()
        flat = {io.INPUT_IDS: self._ids, io.POSITION_IDS: self._pos, io.LOGITS: self._logits}
        if name == io.PAST_LENGTHS:
            return self._lengths.data_ptr()
        return flat[name].data_ptr()

    def _stage(self, first_slot: int, input_ids: np.ndarray) -> None:
        """Copy the step's ids, positions and row lengths to the device (asynchronously, on our stream)."""
        rows, seq = input_ids.shape
        n = rows * seq
        ids = self._ids_host.numpy()
        ids[:n] = input_ids.reshape(-1)
        lengths = self.kv.lengths[first_slot:first_slot + rows]
        self._lengths_host.numpy()[:rows] = lengths
        np.add(lengths[:, None], self._arange[None, :seq], out=self._pos_host.numpy()[:n].reshape(rows, seq))
        with self._torch.cuda.stream(self.stream):
            self._ids[:n].copy_(self._ids_host[:n], non_blocking=True)
            self._pos[:n].copy_(self._pos_host[:n], non_blocking=True)
            self._lengths[:rows].copy_(self._lengths_host[:rows], non_blocking=True)

    def bind(self, first_slot: int, input_ids: np.ndarray) -> None:
        rows, seq = input_ids.shape
        self._stage(first_slot, input_ids)
        profile = select_profile(self.profiles, rows, seq)
        key = (first_slot, rows, seq)
        if self._bound_key[profile] != key:  # shapes and addresses only change with the step's layout
            apply_plan(self.contexts[profile], binding_plan(first_slot, rows, seq, self._num_layers, self._kv_shape,
                                                            self._address, self.aliased))
            self._bound_key[profile] = key
        self._step = (profile, first_slot, rows, seq)

    def execute(self) -> None:
        profile, first, rows, seq = self._step
        started = time.perf_counter()
        if not self.contexts[profile].execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed; see the TensorRT log above")
        n = rows * min(seq, self.logits_tail) * self.vocab_size
        with self._torch.cuda.stream(self.stream):
            if self._present:
                self._commit(first, rows, seq)
            self._logits_host[:n].copy_(self._logits[:n], non_blocking=True)
        self.stream.synchronize()
        self.execute_seconds += time.perf_counter() - started

    def _commit(self, first: int, rows: int, seq: int) -> None:
        """Engines without aliasing: copy the positions this step wrote into the cache."""
        for r in range(rows):
            s = int(self.kv.lengths[first + r])
            for name, cache in self._cache.items():
                present = self._present[name.replace("past_", "present_")]
                cache[first + r, :, s:s + seq].copy_(present[first + r, :, s:s + seq])

    def read_tail_logits(self) -> np.ndarray:
        _, _, rows, seq = self._step
        tail = min(seq, self.logits_tail)
        return self._logits_host.numpy()[:rows * tail * self.vocab_size].reshape(rows, tail, self.vocab_size)

    def read_logits(self) -> np.ndarray:
        return self.read_tail_logits()[:, -1]

    def _copy_rows(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        torch = self._torch
        s = torch.as_tensor(list(src), device="cuda")
        d = torch.as_tensor(list(dst), device="cuda")
        with torch.cuda.stream(self.stream):
            for cache in self._cache.values():
                cache[d, :, :length] = cache[s, :, :length]  # gather first: src may overlap dst
        self.stream.synchronize()

    def zero_rows(self, slot: int, length: int) -> None:
        with self._torch.cuda.stream(self.stream):
            for cache in self._cache.values():
                cache[slot, :, :length].zero_()
        self.stream.synchronize()

    def close(self) -> None:
        self.contexts = []
        self.trt_engine = None
        self._cache.clear()
        self._present.clear()
