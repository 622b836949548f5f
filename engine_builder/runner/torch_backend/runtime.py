"""The torch backend at work: the checkpoint's weights on a torch device, paged KV in device memory.

    forward(batch)   a ModelInput (flat tokens, positions, slots) -> logits [num_logits, vocab] float32, a tensor on
                     the device: the loop samples them there (device_sampler.py); only token ids and the logprobs a
                     request asked for reach the host
    KV               the same PagedKVCacheManager as a paged onnxruntime twin (host_buffers=False: bookkeeping
                     only): block tables, radix prefix reuse by reference, copy-on-write fork; the pools are
                     [num_blocks, block_size, kv_heads, head_dim] device tensors per layer, and the manager's
                     block copies run here (copy_blocks)
    decode steps     on CUDA, replayed from CUDA graphs captured per batch-size bucket (cuda_graphs.py), as is a
                     lone sequence's prefill of up to 256 tokens, per query-length bucket
    images           a vision-language engine's prefill: ModelInput.images' features replace those tokens'
                     embeddings (model.py ImageSplice); where an image's tokens attend both ways (Gemma 3) that
                     step's attention is paged_attention_ref with the image mask, on CUDA too (the Triton kernel
                     is causal only; an image prefill is a call of its own, so decode keeps the kernel)
    tensor parallel  one TorchRuntime per rank, each over its shard with its own pools (its KV heads only), the
                     decoder's collectives between them (tensor_parallel.py); rank 0's drives the others through
                     runner/parallel/ (torch_ranks.py), which splits a step here: prepare the KV bookkeeping, then
                     _step (what every rank runs)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import ClassVar

import numpy as np
import threadpoolctl
import torch

from engine_builder.formats.graph_io import PagedKVLayout
from engine_builder.runner.backend import Backend, WarmUp
from engine_builder.runner.core.model_input import ImageEmbeds, ModelInput
from engine_builder.runner.engine import EngineDir
from engine_builder.runner.kv.block_pool import SCRATCH_BLOCK
from engine_builder.runner.kv.paged_kv_cache import PagedKVCacheManager
from engine_builder.runner.sampler import Sampler
from engine_builder.runner.torch_backend.device import check_utilization, device_memory_budget, torch_device
from engine_builder.runner.torch_backend.device_kv_attention import (
    paged_attention_ref,
    rotary_write_ref,
    slot_mapping,
)
from engine_builder.runner.torch_backend.model import ImageSplice, PagedKV, TorchDecoder
from engine_builder.runner.torch_backend.step_trials import FusedChoice, describe_long_prefills, long_prefill_graphs
from engine_builder.runner.torch_backend.tensor_parallel import TensorParallel
from engine_builder.runner.tunables import TORCH_KV_BLOCK_SIZE
from engine_builder.util import environment
from engine_builder.util.errors import InputError

COMPILE_ENV = "TRTBUILD_TORCH_COMPILE"  # auto (on for CUDA) | on | off: the layers through torch.compile
FUSED_ENV = "TRTBUILD_FUSED_DECODE"  # auto (on for CUDA) | on | off: steps of few tokens through fused_decode.py


class TorchRuntime(Backend):
    """What registered.py's TorchBackend opens (that module registers it without importing torch)."""

    name: ClassVar[str] = "torch"
    title: ClassVar[str] = "PyTorch"
    kv: PagedKVCacheManager  # type: ignore[assignment]
    takes_device_tokens = True

    @property
    def async_by_default(self) -> bool:  # type: ignore[override]
        # on a GPU the host's per-token work is most of a small model's step: async scheduling measured 1.04-1.58x
        # decode and 1.44-2.05x serve on an H100 (benchmarks/results/gpu-decode-*-h100-2026-12-05T15*); a CPU has
        # no second processor to overlap with
        return self.takes_device_tokens and self.device.type == "cuda"

    @classmethod
    def usable(cls, engine: EngineDir) -> tuple[bool, str]:  # the registry asks registered.py's TorchBackend
        return True, ""

    @classmethod
    def open(cls, engine: EngineDir, *, threads: int | None = None) -> TorchRuntime:
        return cls(engine, threads=threads)

    def __init__(self, engine: EngineDir, *, threads: int | None = None, kv_cache_memory: int | None = None,
                 tp: TensorParallel | None = None, device: torch.device | None = None) -> None:
        """TP: this rank of a tp engine dir (its shard, its KV heads); DEVICE: where it runs (default: cuda:LOCAL_RANK
        where CUDA is, else the CPU)."""
        self.engine = engine
        self.device = device or torch_device()
        if self.device.type == "cpu":  # weights and pool in this machine's RAM, as the twin's
            engine.check_host_memory()
        if self.device.type == "cpu" and threads:  # the products' threads (layers.linear); torch's: _step()
            threadpoolctl.threadpool_limits(threads, user_api="blas")
        # bf16/fp16 on a GPU as built; float32 on a CPU (no fast half arithmetic there, as the twin)
        self.dtype = getattr(torch, engine.dtype) if self.device.type == "cuda" else torch.float32
        lim = engine.limits
        # CUDA: the Triton kernel reads the block tables; elsewhere the reference that gathers them
        # (device_kv_attention.py), its oracle
        attention, kv_write = paged_attention_ref, rotary_write_ref
        self._triton = None
        if self.device.type == "cuda":  # Triton ships with torch's CUDA builds, not with the CPU one
            from engine_builder.runner.torch_backend.paged_attention_triton import paged_attention_triton
            from engine_builder.runner.torch_backend.rotary_kv_write_triton import rotary_write_triton

            self._triton = paged_attention_triton
            attention, kv_write = self._kernel, rotary_write_triton
        self.model = TorchDecoder.from_dir(engine.path, device=self.device, dtype=self.dtype,
                                           max_positions=lim.max_seq_len, attention=attention, kv_write=kv_write,
                                           tp=tp)
        block = engine.manifest.build.kv_block_size or TORCH_KV_BLOCK_SIZE
        # self.model.cfg: under tp this rank's heads, so its pools hold its KV heads only
        self.layout = PagedKVLayout.of(self.model.cfg, lim.max_seq_len, str(self.dtype).removeprefix("torch."),
                                       block_size=block)
        self.vocab_size = engine.model.vocab_size
        self.max_input_len = lim.max_input_len
        self.logits_tail = lim.max_input_len  # every position's logits can come back (verify, prompt scoring)
        self.reprefill_after = self.model.reprefill_after
        vision = engine.model.vision
        # under tp the followers get token ids only (runner/parallel/torch_ranks.py), not image features
        self.takes_images = vision is not None and self.model.tp is None
        self._images_both_ways = vision is not None and vision.image_attention == "bidirectional"
        # the layers through torch.compile (compiled_forward.py), on a GPU by default: SmolLM2's decode step went from
        # 1,200 kernels to 480 and from 2.3 to 1.1 ms of GPU time on an H100, its compile taking 21 s at load
        # (benchmarks/results/gpu-step-profile-*); on a CPU the eager model is the tested reference path, and tp ranks
        # stay eager by default (their collectives inside a compiled layer have not run on GPUs yet)
        self.compiled = None
        compile_mode = environment.read(COMPILE_ENV)
        if compile_mode == "on" or (compile_mode == "auto" and self.device.type == "cuda" and self.model.tp is None):
            from engine_builder.runner.torch_backend.compiled_forward import CompiledForward

            self.compiled = CompiledForward(self.model)
        # steps of few tokens on CUDA: the layers as six Triton launches each (fused_decode.py), where the layer is
        # llama-shaped and (auto) a trial finds it faster (step_trials.py); on a CPU only when asked, under Triton's
        # interpreter (its tests)
        fused_mode = environment.read(FUSED_ENV)
        on = fused_mode == "on" or (fused_mode == "auto" and self.device.type == "cuda")
        self.fused = FusedChoice(fused_decode(self.model, self.device, asked=fused_mode == "on") if on else None,
                                 trial=fused_mode == "auto")
        self.kv_update = "in_place"
        self.execute_seconds = 0.0
        self._gpu_memory_utilization: float | None = None  # the device's default (size_kv_by_device sets it)
        self._new_pool(kv_cache_memory, prefix_cache=True)

    # --- KV --------------------------------------------------------------------------------------------

    def _new_pool(self, kv_cache_memory: int | None, prefix_cache: bool) -> None:
        if kv_cache_memory is None:
            kv_cache_memory = device_memory_budget(self.device, self._gpu_memory_utilization)
        self.kv = PagedKVCacheManager.for_layout(self.layout, self.engine.limits.max_batch, kv_cache_memory,
                                                 prefix_cache, host_buffers=False)
        self.kv.pool.copy_blocks = self._copy_blocks
        self._allocate_pools(self.kv.pool.num_blocks)

    def _allocate_pools(self, num_blocks: int) -> None:
        """The device pools of NUM_BLOCKS blocks (the KV manager's pool size), and the decode graphs over them."""
        shape = (num_blocks, self.layout.block_size, self.layout.kv_heads, self.layout.head_dim)
        # zeros: a block never written is finite (the kernel never reads past a context length, the
        # reference path neither; zeros keep a stray read harmless)
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layout.num_layers)]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layout.num_layers)]
        self._graphs = None
        if self.device.type == "cuda":
            from engine_builder.runner.torch_backend.cuda_graphs import StepGraphs

            self._graphs = StepGraphs(self)

    def resize_kv(self, kv_cache_memory: int | None, prefix_cache: bool = True) -> None:
        """A new pool of kv_cache_memory bytes, or of what the device's memory leaves (None); before any request
        runs: every slot must be free."""
        if self.kv.num_free != self.kv.batch_slots:
            raise InputError("the KV cache can be resized only while no request runs")
        self.keys = self.values = []
        self._graphs = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the old pool's memory back to the device before the budget counts it
        self._new_pool(kv_cache_memory, prefix_cache)

    def size_kv_by_device(self, gpu_memory_utilization: float) -> None:
        """A new pool of what the device's memory leaves at this utilization (--gpu-memory-utilization)."""
        check_utilization(gpu_memory_utilization)  # before the old pool goes
        self._gpu_memory_utilization = gpu_memory_utilization
        self.resize_kv(None)

    def _copy_blocks(self, src: Sequence[int], dst: Sequence[int]) -> None:
        s = torch.as_tensor(list(src), device=self.device)
        d = torch.as_tensor(list(dst), device=self.device)
        for pool in (*self.keys, *self.values):
            pool.index_copy_(0, d, pool.index_select(0, s))

    def copy_slots(self, src: Sequence[int], dst: Sequence[int]) -> None:
        """Beam fan-out and reordering: dst slots map src slots' blocks (copy-on-write), no KV is copied."""
        self.kv.copy_slots(src, dst)

    def _copy_rows(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        raise NotImplementedError("a paged cache forks blocks (copy_slots); it has no rows to copy")

    # --- the step --------------------------------------------------------------------------------------

    def forward(self, batch: ModelInput) -> torch.Tensor:
        started = time.perf_counter()
        if batch.images is not None and not self.takes_images:  # before any rank is told to step
            self.bind_images(batch.images.token_index, batch.images.embeds)  # Backend's one-line refusal
        self.kv.prepare_writes(batch.slots, batch.query_lens)
        logits = self._step(batch)
        self.execute_seconds += time.perf_counter() - started
        return logits

    def _step(self, batch: ModelInput) -> torch.Tensor:
        """The model over BATCH, its blocks in place (prepare_writes done): a captured step's replay, or eager."""
        if self.device.type == "cpu" and torch.get_num_threads() != 1:
            # the products go through numpy's OpenBLAS (layers.linear) on its own threads; torch's OpenMP threads,
            # spinning after each op they split, kept those off the cores (SmolLM2 on 2 EPYC cores: decode 22.7
            # tok/s with torch on 1 thread and OpenBLAS on 2, 18.4 the other way round, 2.9 with both on 2). Set
            # here, in the thread that steps (a tp follower's too): a thread that has run a torch op keeps its own
            # count. It is also the process's default from then on, MKL's included: the process's other torch
            # work runs on one thread too (what torch runs here is small ops, one enough)
            torch.set_num_threads(1)
        key = self._graphs.bucket(batch) if self._graphs is not None and batch.images is None else None
        if key is not None:
            self.fused.settle(self._graphs)  # before the first graph: which steps the fused model runs
            return self._graphs.run(batch, key)
        return self._eager(batch)

    def block_tables(self, slots: np.ndarray, context_lens: np.ndarray) -> np.ndarray:
        """[seqs, width] int32: each slot's blocks, width the longest context's block count."""
        width = max(1, -(-int(context_lens.max()) // self.layout.block_size))
        return self.kv.block_table[slots, :width].astype(np.int32)

    def _eager(self, batch: ModelInput) -> torch.Tensor:
        dev = self.device

        def put(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a)).to(dev, non_blocking=True)

        tables = self.block_tables(batch.slots, batch.context_lens)
        images = None
        if batch.images is not None:
            ids = _image_runs(batch.images, batch.num_tokens) if self._images_both_ways else None
            images = ImageSplice(put(batch.images.token_index), put(batch.images.embeds),
                                 put(ids) if ids is not None else None)
        ids = put(batch.token_ids)
        if batch.device_tokens is not None:  # the last step's samples, still on the device (async scheduling)
            taken = batch.device_tokens
            ids.index_copy_(0, put(taken.rows), taken.source.index_select(0, put(taken.index)))
        return self.run_model(ids, put(batch.positions), put(tables), put(batch.context_lens),
                              put(batch.query_start), put(batch.seq_of_token),
                              put(batch.logits_indices), max_query_len=int(batch.query_lens.max()), images=images)

    def run_model(self, token_ids: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor,
                  context_lens: torch.Tensor, query_start: torch.Tensor, seq_of_token: torch.Tensor,
                  logits_indices: torch.Tensor, *, max_query_len: int,
                  images: ImageSplice | None = None) -> torch.Tensor:
        """The model over device tensors (ModelInput's fields; block_tables [seqs, width] int32): logits
        [num_logits, vocab] float32, through the compiled model where there is one (compiled_forward.py). No host
        synchronization on CUDA: a CUDA graph captures it (cuda_graphs.py). IMAGES: a vision-language prefill's
        features, always through the eager model (the compiled one has no image input)."""
        slots = slot_mapping(block_tables, positions, seq_of_token, self.layout.block_size)
        kv = PagedKV(self.keys, self.values, block_tables, context_lens, query_start, slots)
        self._max_query_len = max_query_len  # the kernel's grid: a host int, never read off the device
        if images is not None:
            return self.model(token_ids, positions, kv, logits_indices, images)
        model = self.compiled if self.compiled is not None else self.model
        if token_ids.shape[0] <= self.fused.max_tokens:
            model = self.fused.model
        return model(token_ids, positions, kv, logits_indices)

    def warm_up(self, progress: Callable[[str], None] | None = None) -> WarmUp | None:
        """Pay now what the first requests would: torch.compile of the layers (a one-token and a longer step), the
        attention kernel's variants (short and long queries, with and without split key ranges) and every decode
        bucket's CUDA graph; and settle what is measured here: the fused decode layer's trial and the prefill graphs
        past 256 tokens. Every step runs over the scratch block only: no slot, no cached block is touched.
        None where there is nothing to pay (eager on a CPU)."""
        if self.compiled is None and self._graphs is None:
            return None
        if progress is not None:
            what = ["torch.compile of the layers"] if self.compiled is not None else []
            if self.fused.model is not None:
                what.append("the fused decode kernels' autotune")
            if self._graphs is not None:
                g = self._graphs
                prefills = f", prefill {g.prefill_sizes[0]}..{g.prefill_sizes[-1]} tokens" if g.prefill_sizes else ""
                what.append(f"{g.count} CUDA graphs (decode batch {g.sizes[0]}..{g.sizes[-1]}{prefills})")
            progress(f"warming up: {' and '.join(what)}")
        started = time.perf_counter()
        compile_before = self.compiled.seconds if self.compiled is not None else 0.0
        width = self.layout.max_blocks_per_seq
        queries = {1, 2, min(64, self.max_input_len), self.max_input_len}
        if self._triton is not None:  # a step of each tile's shortest query compiles that tile (its kernel variant)
            from engine_builder.runner.torch_backend.paged_attention_triton import tile_queries

            cfg = self.model.cfg
            queries |= set(tile_queries(cfg.num_heads // cfg.num_kv_heads, cfg.head_dim, self.max_input_len,
                                        self.dtype.itemsize))
        for query in sorted(queries):
            for blocks in sorted({-(-query // self.layout.block_size), width}):  # a short and the longest table
                self._scratch_step(query, blocks)
        capture, long_prefills = 0.0, []
        if self._graphs is not None:
            if self.fused.settle(self._graphs) and progress is not None:
                progress(self.fused.describe())
            capture = self._graphs.capture_all()
            long_prefills = long_prefill_graphs(self._graphs, self.max_input_len, self._eager_ms)
        if progress is not None and long_prefills:
            progress(describe_long_prefills(long_prefills))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        compile_s = (self.compiled.seconds if self.compiled is not None else 0.0) - compile_before
        return WarmUp(time.perf_counter() - started, compile_s, capture,
                      self._graphs.count if self._graphs is not None else 0)

    def _eager_ms(self, query: int, runs: int = 3) -> float:
        """The median wall milliseconds of a scratch step of QUERY tokens launched eagerly (the compiled layers)."""
        times = []
        for _ in range(runs):
            torch.cuda.synchronize(self.device)
            started = time.perf_counter()
            self._scratch_step(query, -(-query // self.layout.block_size))
            torch.cuda.synchronize(self.device)
            times.append(1e3 * (time.perf_counter() - started))
        return float(np.median(times))

    def _scratch_step(self, query: int, blocks: int) -> None:
        """One sequence of QUERY new tokens at positions 0.., its block table BLOCKS scratch blocks wide."""
        dev, i64 = self.device, torch.int64
        tables = torch.full((1, blocks), SCRATCH_BLOCK, dtype=torch.int32, device=dev)
        at = torch.arange(query, dtype=i64, device=dev)
        self.run_model(torch.zeros(query, dtype=i64, device=dev), at, tables,
                       torch.tensor([query], dtype=i64, device=dev), torch.tensor([0, query], dtype=i64, device=dev),
                       torch.zeros(query, dtype=i64, device=dev), at[-1:], max_query_len=query)

    def _kernel(self, q, k_pool, v_pool, block_tables, context_lens, query_start, *, scale, softcap=None,
                sliding_window=None, image_ids=None):
        """The Triton paged-attention kernel with paged_attention_ref's signature (the model's attention); a step with
        an image attending both ways goes to the reference, the kernel's masks being causal (and windowed) only."""
        if image_ids is not None:
            return paged_attention_ref(q, k_pool, v_pool, block_tables, context_lens, query_start, scale=scale,
                                       softcap=softcap, sliding_window=sliding_window, image_ids=image_ids)
        return self._triton(q, k_pool, v_pool, block_tables, context_lens, query_start, scale=scale, softcap=softcap,
                            sliding_window=sliding_window, max_query_len=self._max_query_len)

    def to_host(self, logits: torch.Tensor) -> np.ndarray:
        return logits.float().cpu().numpy()

    def make_sampler(self, seed: int | None = None) -> Sampler:
        from engine_builder.runner.torch_backend.device_sampler import TorchSampler

        return TorchSampler(seed)

    def close(self) -> None:
        self.keys = self.values = []
        self._graphs = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _image_runs(images: ImageEmbeds, num_tokens: int) -> np.ndarray:
    """[num_tokens] int64: 1, 2.. for each run of consecutive image tokens of the step, 0 for text; the numbering of
    network/masks.py image_block_visible (and transformers' token_type_ids blocks). A run never crosses sequences
    in effect: attention is per sequence."""
    mask = np.zeros(num_tokens, bool)
    mask[images.token_index] = True
    starts = mask & ~np.r_[False, mask[:-1]]
    return np.where(mask, np.cumsum(starts), 0).astype(np.int64)


def fused_decode(model: TorchDecoder, device: torch.device, *, asked: bool):
    """fused_decode.py's model for steps of few tokens, or None where the model's layer is not llama-shaped (ASKED,
    TRTBUILD_FUSED_DECODE=on: an InputError saying what it has instead). On a CPU Triton runs only interpreted: an
    InputError naming TRITON_INTERPRET without it."""
    from engine_builder.runner.torch_backend.fused_decode import FusedDecode, unsupported

    why = unsupported(model)
    if why is not None and asked:
        raise InputError(f"{FUSED_ENV}=on: this {model.cfg.architecture} model's layer has {why}, which the fused "
                         f"decode layer does not run; unset it (auto runs the compiled layer for such a model)")
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise InputError(f"{FUSED_ENV}=on runs Triton kernels, which need a CUDA GPU (or TRITON_INTERPRET=1, Triton's "
                         f"slow CPU interpreter, for tests); unset it on this {device.type} machine")
    return FusedDecode(model) if why is None else None
