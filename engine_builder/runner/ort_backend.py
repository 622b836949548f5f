"""onnxruntime backend: the engine dir's model.onnx on CPU, with IO binding and no per-token allocation.

Every buffer is allocated once and bound by address: input_ids and position_ids (flat buffers
viewed as [rows, seq]), past_lengths (the KVCacheManager's own `lengths` row range), the logits
[rows, 1, vocab] and the KV cache. Decode bindings ([0, rows) with seq 1) are built once per row
count and reused; a step then only writes the new token ids and positions.

KV update, chosen from the graph (formats/kv_update_graph.py; the build records it in the graph's metadata):
  in_place  past_key.{i} and present_key.{i} are bound to the same address. GroupQueryAttention
            (com.microsoft, what the onnxruntime lowering pass emits) and TensorScatter-24 both
            detect the shared buffer and write only the new positions (onnxruntime 1.31's
            TensorScatter logs "in-place optimization not activated, copying..." when it is not).
  copy      any other producer of present_*: binding it over its own input is not known to be
            safe, so present_* is bound to a second, preallocated buffer set. The graph then copies
            the whole cache into it every step (its semantics), and we copy back only the positions
            this step wrote (one per row in decode). No allocation either way.
A model metadata entry trtbuild.kv_update = in_place | copy overrides the graph inspection; every build
writes one, so a load reads it from the session's metadata without importing onnx.

trtbuild.gqa_rows_per_call = 1 (passes/drop_ort_attention_fallback.py: GroupQueryAttention without the If
that served the one step CPU GQA refuses): a step of several rows and several tokens over a non-empty
cache (batched chunked prefill, prefix reuse) runs one row per call, each binding pointing at its row
of the same ids, positions, cache and logits buffers.

Graph optimization level: ENABLE_ALL for float32; BASIC for float16/bfloat16, because DESIGN §4
records EXTENDED corrupting some fp16 graphs. Measured here (SmolLM2 and the tiny models, default
and GroupQueryAttention graphs, 12 greedy steps vs ORT_DISABLE_ALL): every level gave the same
tokens; fp32 max |Δlogit| <= 5e-5 at BASIC/EXTENDED/ALL, fp16 0.03-0.05 (fp16 noise) at all three.
tests/runner/test_ort_backend.py keeps checking the shipped level of each dtype on SmolLM2. The levels
live in formats/ort_graph_levels.py, shared with the build's prepacked twin (model.prepacked.onnx: the
graph optimized at that level with its MatMul weights packed, loaded with optimizations off where the
CPU and onnxruntime match: formats/ort_prepacked.py; ~0.25 s less CPU per SmolLM2 start).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import onnxruntime as ort

from engine_builder.formats import graph_io as io
from engine_builder.formats.graph_io import KVCacheLayout
from engine_builder.formats.kv_update_graph import kv_update_mode, recorded_kv_update
from engine_builder.formats.ort_graph_levels import GRAPH_CONFIG, optimization_level
from engine_builder.formats.ort_prepacked import META_PREPACKED_FOR, PREPACKED_MODEL, cpu_signature
from engine_builder.runner.backend import Backend, KVUpdate, register_backend
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.kv.kv_cache import KVCacheManager
from engine_builder.runner.ort_spinning import allow_spinning, stop_spinning_after_run
from engine_builder.util.cpu_cores import physical_cores
from engine_builder.util.errors import InputError, UnsupportedError

_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16",
              "tensor(int8)": "int8"}  # int8: `convert --kv-cache int8`


def session_options(dtype: str, threads: int | None = None,
                    level: ort.GraphOptimizationLevel | None = None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = optimization_level(dtype) if level is None else level
    options.intra_op_num_threads = threads or physical_cores()
    # spin-wait between kernels only when the machine has idle cores for it (runner/ort_spinning.py)
    options.add_session_config_entry("session.intra_op.allow_spinning",
                                     "1" if allow_spinning(options.intra_op_num_threads)[0] else "0")
    if stop_spinning_after_run():  # a speculative target and its draft take turns (runner/ort_spinning.py)
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.inter_op_num_threads = 1  # a decoder is one chain of ops: nothing to run in parallel
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3  # errors only: warnings would interleave with streamed text
    for key, value in GRAPH_CONFIG.items():  # e.g. MatMulNBits' accuracy level (formats/ort_graph_levels.py)
        options.add_session_config_entry(key, value)
    return options


def load_session(engine: EngineDir, threads: int | None = None,
                 optimization_level: ort.GraphOptimizationLevel | None = None) -> ort.InferenceSession:
    """The twin's session: the build's prepacked graph where this CPU and onnxruntime can use it (weights
    packed at build: formats/ort_prepacked.py), else model.onnx (and always when a level is asked for). One set
    of options, so one spinning decision, whichever graph opens: a prepacked graph packed on another CPU, opened
    and dropped, used to count its threads as spinning and leave model.onnx's without (runner/ort_spinning.py)."""
    options = session_options(engine.twin_dtype, threads, optimization_level)
    if optimization_level is None:
        session = _prepacked_session(engine, options)
        if session is not None:
            return session
    try:
        return ort.InferenceSession(str(engine.onnx_path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/NotImplemented types
        dtype = engine.twin_dtype
        fix = ("rebuild the engine dir with this trtbuild" if dtype == "float32" else
               f"its CPU kernels do not cover every {dtype} op: rebuild with --dtype float32 to run on CPU")
        raise UnsupportedError(f"onnxruntime {ort.__version__} cannot load {engine.onnx_path}: "
                               f"{str(exc).splitlines()[0]}; {fix}") from None


def _prepacked_session(engine: EngineDir, options: ort.SessionOptions) -> ort.InferenceSession | None:
    graph = engine.path / PREPACKED_MODEL
    if not graph.is_file():
        return None
    level = options.graph_optimization_level
    # already optimized at the level a load would use: optimizing again would only cost time
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 (onnxruntime's own types): model.onnx is the twin; this is a shortcut
        session = None
    finally:
        options.graph_optimization_level = level  # for model.onnx, if this one is not used
    made_for = session.get_modelmeta().custom_metadata_map.get(META_PREPACKED_FOR) if session is not None else None
    # packed for another CPU or onnxruntime: unused before any run, model.onnx is loaded instead
    return session if made_for is not None and made_for == cpu_signature() else None


@register_backend(preference=0)
class OrtBackend(Backend):
    name = "onnxruntime"
    title = "onnxruntime"
    layout_backends: ClassVar[dict[str, type[OrtBackend]]] = {}  # EngineDir.kv_layout_kind -> class
    rows_per_call = False  # graph metadata gqa_rows_per_call (passes/drop_ort_attention_fallback.py)
    _row_bindings: list[ort.IOBinding] | None = None  # a step run a row a call: its bindings, one per row

    @classmethod
    def usable(cls, engine: EngineDir) -> tuple[bool, str]:
        return True, ""  # every engine dir carries its twin (EngineDir.load checks the file)

    @classmethod
    def open(cls, engine: EngineDir, *, threads: int | None = None) -> OrtBackend:
        # another KV layout's subclass (paged: runner/ort_paged.py registers itself here)
        return cls.layout_backends.get(engine.kv_layout_kind, cls)(engine, threads=threads)

    def __init__(self, engine: EngineDir, *, threads: int | None = None,
                 optimization_level: ort.GraphOptimizationLevel | None = None,
                 kv_update: KVUpdate | None = None) -> None:
        self.engine = engine
        engine.check_host_memory()  # sized before any allocation
        self.session = load_session(engine, threads, optimization_level)
        layout = engine.twin_kv_layout
        _check_graph_cache(engine, {i.name: i for i in self.session.get_inputs()}, layout)
        num_layers, max_seq = layout.num_layers, layout.max_seq
        self.kv_dtype = layout.dtype
        lim = engine.limits
        self.kv = KVCacheManager.for_layout(layout, lim.max_batch)
        self.vocab_size = int(self.session.get_outputs()[0].shape[-1])
        self.max_input_len = lim.max_input_len
        meta = self.session.get_modelmeta().custom_metadata_map
        self.reprefill_after = io.reprefill_after(meta)
        self.all_logits = meta.get(io.META_ALL_LOGITS) == "true"
        self.logits_tail = io.logits_tail(meta)  # 1 << 30 with all_logits: every position
        # GQA without its fallback branch: a multi-token step of several rows over a non-empty cache runs a row a call
        self.rows_per_call = meta.get(io.META_GQA_ROWS_PER_CALL) == "1"
        if kv_update is not None:
            self.kv_update, self.kv_update_reason = kv_update, "requested"
        else:  # the build's record in the graph's metadata; engine dirs built before it: read the graph
            self.kv_update, self.kv_update_reason = recorded_kv_update(meta) or kv_update_mode(engine.onnx_path)
        self._num_layers = num_layers
        self._kv_shape = layout.shape(0)[1:]  # [kv_heads, max_seq, head_dim]
        # Flat buffers viewed as [rows, seq]: a row range of a 2-D array would not be contiguous.
        # A re-prefill (longrope) feeds a whole sequence: up to max_seq_len tokens in one row.
        width = max(lim.max_batch * lim.max_input_len, int(max_seq))
        self._ids = np.zeros(width, np.int64)
        self._pos = np.zeros(width, np.int64)
        self._arange = np.arange(width, dtype=np.int64)
        tail = 1 if self.all_logits else self.logits_tail
        self._logits = np.zeros(lim.max_batch * tail * self.vocab_size, np.float32)  # [rows, tail, vocab] bound
        # copy mode: present_* land here; only the new positions go back into the cache
        self._present = None
        if self.kv_update == "copy":
            self._present = ([np.zeros_like(k) for k in self.kv.keys], [np.zeros_like(v) for v in self.kv.values])
        self._init_images(width)
        self._decode_bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self._verify_bindings: dict[tuple[int, int], ort.IOBinding] = {}  # (slot, seq) of one-row verify steps
        self._bound: tuple[ort.IOBinding, int, int, int] | None = None  # binding, first slot, rows, seq
        self.execute_seconds = 0.0

    def bind(self, first_slot: int, input_ids: np.ndarray) -> None:
        rows, seq = input_ids.shape
        n = rows * seq
        self._ids[:n] = input_ids.reshape(-1)
        positions = self._pos[:n].reshape(rows, seq)
        np.add(self.kv.lengths[first_slot:first_slot + rows, None], self._arange[None, :seq], out=positions)
        if seq == 1:  # decode: the same (first, rows) recurs every step
            binding = self._decode_bindings.get((first_slot, rows))
            if binding is None:
                binding = self._decode_bindings[first_slot, rows] = self._make_binding(first_slot, rows, 1)
        elif rows == 1 and seq <= min(self.logits_tail, 32):  # speculative verify steps: few shapes, every step
            binding = self._verify_bindings.get((first_slot, seq))
            if binding is None:
                binding = self._verify_bindings[first_slot, seq] = self._make_binding(first_slot, 1, seq)
        else:
            binding = self._make_binding(first_slot, rows, seq)
        self._row_bindings = None
        if self.rows_per_call and rows > 1 and seq > 1 and self.kv.lengths[first_slot:first_slot + rows].any():
            # the step CPU GroupQueryAttention refuses: the same step a row at a time, into the same buffers
            self._row_bindings = [self._make_binding(first_slot + r, 1, seq, row=r) for r in range(rows)]
        self._bound = (binding, first_slot, rows, seq)

    def _make_binding(self, first: int, rows: int, seq: int, row: int = 0) -> ort.IOBinding:
        """Slots first.. first + rows - 1; row: where this binding's rows start in the step's ids and logits."""
        b = self.session.io_binding()
        b.bind_input(io.INPUT_IDS, "cpu", 0, np.int64, (rows, seq), self._ids[row * seq:].ctypes.data)
        b.bind_input(io.POSITION_IDS, "cpu", 0, np.int64, (rows, seq), self._pos[row * seq:].ctypes.data)
        lengths = self.kv.lengths[first:first + rows]  # the manager's own array: no copy per step
        b.bind_input(io.PAST_LENGTHS, "cpu", 0, np.int64, (rows,), lengths.ctypes.data)
        self._bind_image_inputs(b, rows, seq, row * seq)
        shape = (rows, *self._kv_shape)  # [rows, kv_heads, max_seq, head_dim]
        dtype = self.kv.dtype
        for i in range(self._num_layers):
            for past_name, present_name, past, present in (
                    (io.past_key(i), io.present_key(i), self.kv.keys[i], self._present and self._present[0][i]),
                    (io.past_value(i), io.present_value(i), self.kv.values[i], self._present and self._present[1][i])):
                address = past[first:first + rows].ctypes.data
                b.bind_input(past_name, "cpu", 0, dtype, shape, address)
                out = address if present is None else present[first:first + rows].ctypes.data
                b.bind_output(present_name, "cpu", 0, dtype, shape, out)
        if self.all_logits:  # [rows, seq, vocab]: let onnxruntime size it; only the last position is read
            b.bind_output(io.LOGITS, "cpu")
        else:
            tail = min(seq, self.logits_tail)  # [rows, min(seq, tail), vocab]
            b.bind_output(io.LOGITS, "cpu", 0, np.float32, (rows, tail, self.vocab_size),
                          self._logits[row * tail * self.vocab_size:].ctypes.data)
        return b

    def _init_images(self, width: int) -> None:
        """A vision-language twin's image inputs (graph_io IMAGE_EMBEDS / IMAGE_MASK), bound by address like the ids:
        the mask all false but where bind_images puts a feature for one execute."""
        self.takes_images = io.IMAGE_EMBEDS in {i.name for i in self.session.get_inputs()}
        hidden = self.engine.model.hidden_size if self.takes_images else 0
        self._image_embeds = np.zeros((width if self.takes_images else 0, hidden), np.float32)
        self._image_mask = np.zeros(width if self.takes_images else 0, bool)
        self._image_at: np.ndarray | None = None

    def _bind_image_inputs(self, b: ort.IOBinding, rows: int, seq: int, at: int) -> None:
        if self.takes_images:
            b.bind_input(io.IMAGE_EMBEDS, "cpu", 0, np.float32, (rows, seq, self._image_embeds.shape[1]),
                         self._image_embeds[at:].ctypes.data)
            b.bind_input(io.IMAGE_MASK, "cpu", 0, np.bool_, (rows, seq), self._image_mask[at:].ctypes.data)

    def bind_images(self, at: np.ndarray, embeds: np.ndarray) -> None:
        if not self.takes_images:
            super().bind_images(at, embeds)
        self._image_embeds[at] = embeds
        self._image_mask[at] = True
        self._image_at = at

    def execute(self) -> None:
        binding, first, rows, seq = self._bound
        started = time.perf_counter()
        for b in self._row_bindings or (binding,):
            self.session.run_with_iobinding(b)
        self.execute_seconds += time.perf_counter() - started
        if self._image_at is not None:  # the next call's rows take their token embeddings again
            self._image_mask[self._image_at] = False
            self._image_at = None
        if self._present is not None:
            self._commit(first, rows, seq)

    def _commit(self, first: int, rows: int, seq: int) -> None:
        """copy mode: move the positions this step wrote from present_* into the cache."""
        starts = self.kv.lengths[first:first + rows]  # [rows], not yet advanced
        for cache, present in zip((*self.kv.keys, *self.kv.values), (*self._present[0], *self._present[1])):
            if seq == 1:
                idx = np.arange(first, first + rows)
                cache[idx, :, starts] = present[idx, :, starts]  # [rows, kv_heads, head_dim]
            else:
                for r in range(rows):
                    s = int(starts[r])
                    cache[first + r, :, s:s + seq] = present[first + r, :, s:s + seq]

    def read_logits(self) -> np.ndarray:
        return self.read_tail_logits()[:, -1]

    def read_tail_logits(self) -> np.ndarray:
        binding, _, rows, seq = self._bound
        if self.all_logits:
            return np.concatenate([b.get_outputs()[0].numpy() for b in self._row_bindings or (binding,)])
        tail = min(seq, self.logits_tail)
        return self._logits[:rows * tail * self.vocab_size].reshape(rows, tail, self.vocab_size)

    def _copy_rows(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        src, dst = list(src), list(dst)
        for cache in (*self.kv.keys, *self.kv.values):
            cache[dst, :, :length] = cache[src, :, :length]  # fancy-index read copies first: src may overlap dst

    def close(self) -> None:
        self._decode_bindings.clear()
        self._verify_bindings.clear()
        self._bound = self._row_bindings = None
        self.session = None  # type: ignore[assignment]


def _check_graph_cache(engine: EngineDir, inputs: dict[str, ort.NodeArg], layout: KVCacheLayout) -> None:
    """model.onnx takes the cache its manifest describes (a dir mixed from two builds fails here, not mid-run)."""
    past = [n for n in inputs if n.startswith("past_key.")]
    first = inputs.get(io.past_key(0))
    if (len(past) != layout.num_layers or first is None or list(first.shape[1:]) != list(layout.shape(0)[1:])
            or _ORT_TYPES.get(first.type) != layout.dtype):
        graph = f"{len(past)} layers of {first.shape[1:]} {first.type}" if first is not None else "no past_key.0"
        raise InputError(f"{engine.onnx_path} takes a KV cache of {graph}, but its manifest describes "
                         f"{layout.num_layers} layers of {list(layout.shape(0)[1:])} {layout.dtype}; the engine dir "
                         "mixes two builds: rebuild it with `trtbuild build <ckpt-dir> "
                         f"{engine.path} --force`")
