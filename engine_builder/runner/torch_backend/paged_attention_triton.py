"""Paged attention as a Triton kernel: device_kv_attention.py's paged_attention_ref, reading the block table on the GPU.

Same contract as the reference (device_kv_attention.py's docstring): a flat batch, sequence i's queries
q[query_start[i]:query_start[i + 1]] are the last positions of the context_lens[i] it holds, causal, within
sliding_window when given, soft-cap before the mask, scores and softmax in float32, output in q's dtype.

One program per (sequence, kv head, query tile[, split]). Its tile's rows are (query token, query head of that kv
head) pairs, row r = token r // GROUP, head kv_head * GROUP + r % GROUP: decode puts the whole GQA group of one
token in one tile (SmolLM2's 3 heads in 16 rows, the smallest M tl.dot takes), so each K/V element is read once
for all the heads that share it; a multi-token query (chunked prefill, speculative verify) puts BLOCK_M // GROUP
tokens in a tile and masks by position. The program streams the sequence's keys BLOCK_N at a time, gathered
through the block table (each row of a tile is one pool slot: head_dim contiguous elements), with an online
softmax in log2 units (flash-attention 2).

Split-K (flash-decoding): when (sequences x kv heads x query tiles) would leave the GPU's multiprocessors idle
(batch 1 with a long context), each program takes 1/num_splits of its tile's key range and writes a float32
partial (its normalized output and log-sum-exp) and counts itself done on its tile's counter; the last split to
finish weighs the partials into the output. A second kernel did that before (one more launch a layer whenever a
step splits, as every batch-1 decode step's graph does: 30 of SmolLM2's 480 launches a step).

CUDA-graph capturable: the grid comes from host ints only (num_seqs = block_tables.shape[0], max_query_len,
num_splits from the block table's width), nothing reads a device tensor on the host. A sequence with no queries
(a CUDA-graph bucket's padding row) reads two query_start entries and returns; rows of q that no sequence owns
(a bucket's tail) are left as they were in out.

One compiled variant per tile and split (and per model: head counts, head_dim, soft-cap, window): the ints that
change from step to step (the token count, the split count, the block table's width) are not specialized on
(Triton would otherwise compile anew for each of 1, a multiple of 16 and anything else, mid-serving: ~1 s each),
so the warm-up's steps (one per tile: tile_queries) and graph captures compile the variants a model's steps take.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine_builder.runner.tunables import (
    KERNEL_DEFAULT_SMS,
    KERNEL_MAX_SPLITS,
    KERNEL_MIN_TILES_PER_SPLIT,
    KERNEL_PROGRAMS_PER_SM,
    KERNEL_SPLIT_COUNTERS,
)

LOG2E = tl.constexpr(1.4426950408889634)  # scores in log2 units: exp2 is one instruction (MUFU.EX2), exp is two


@triton.jit(do_not_specialize=["num_splits", "num_tokens", "stride_bt"])  # step-varying ints (module doc)
def _paged_attention_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, part_out_ptr, part_lse_ptr, counters_ptr,
        block_tables_ptr, context_lens_ptr, query_start_ptr,
        scale, softcap, sliding_window, num_splits, num_tokens,
        stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
        stride_ot, stride_oh, stride_bt,
        KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
        BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
        SPLIT: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, DOT_PRECISION: tl.constexpr):
    seq_head = tl.program_id(0)  # sequences x kv heads on the long grid axis (2^31 - 1; the others stop at 65535)
    q_tile = tl.program_id(1)
    split = tl.program_id(2)
    seq = seq_head // KV_HEADS
    kv_head = seq_head % KV_HEADS

    q_start = tl.load(query_start_ptr + seq).to(tl.int32)
    q_len = tl.load(query_start_ptr + seq + 1).to(tl.int32) - q_start
    first = q_tile * BLOCK_Q  # the tile's first query, counted within the sequence's queries
    if first >= q_len:  # a padding row (no queries) or a tile past a short query: nothing to read or write
        return
    ctx = tl.load(context_lens_ptr + seq).to(tl.int32)

    offs_m = tl.arange(0, BLOCK_M)
    q_in_tile = offs_m // GROUP  # [BLOCK_M] the row's token within the tile
    q_idx = first + q_in_tile  # [BLOCK_M] ... within the sequence's queries
    row_ok = (q_in_tile < BLOCK_Q) & (q_idx < q_len)  # rows past BLOCK_Q * GROUP pad the tile to a power of two
    head = kv_head * GROUP + offs_m % GROUP  # [BLOCK_M] the row's query head
    q_pos = ctx - q_len + q_idx  # [BLOCK_M] the row's absolute position (its own key is there already)
    tok = q_start + q_idx  # [BLOCK_M] the row's index in the flat batch
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    if HEAD_DIM_PAD == HEAD_DIM:
        d_ok = tl.full([HEAD_DIM_PAD], 1, tl.int1)  # a constant mask keeps the loads 16 bytes wide
    else:
        d_ok = offs_d < HEAD_DIM

    q = tl.load(q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, HEAD_DIM_PAD]
    q = q.to(k_ptr.dtype.element_ty)  # tl.dot takes one dtype: the pool's (bf16 tensor cores)

    # the tile's key range: up to its last query's own position; from its first query's window start
    last = tl.minimum(first + BLOCK_Q, q_len) - 1
    kv_end = ctx - q_len + last + 1
    kv_lo = 0
    if WINDOW:
        kv_lo = tl.maximum(ctx - q_len + first - sliding_window + 1, 0)
        kv_lo = (kv_lo // BLOCK_N) * BLOCK_N  # tiles stay aligned to the pool's blocks
    if SPLIT:
        # splits share the tile's actual range (num_splits was sized for the longest possible context)
        per_split = tl.cdiv(tl.cdiv(kv_end - kv_lo, BLOCK_N), num_splits) * BLOCK_N
        lo = kv_lo + split * per_split
        hi = tl.minimum(kv_end, lo + per_split)
    else:
        lo = kv_lo
        hi = kv_end

    if SOFTCAP:
        qk_scale = scale / softcap
    else:
        qk_scale = scale * LOG2E
    # -1e30, not -inf: a row that sees nothing yet keeps exp2(m_i - m_new) finite (1, not NaN)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        k_pos = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] absolute key positions
        k_ok = k_pos < hi
        # [BLOCK_N] int64: pools past 2^31 elements (a layer's pool on a 141 GB card) stay addressable
        blk = tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot = k_pos % BLOCK_SIZE
        kv_mask = k_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + (blk * stride_kb + slot * stride_ks + kv_head * stride_kh)[:, None] + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_N, HEAD_DIM_PAD]
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_N] float32
        if SOFTCAP:
            # cap * tanh(scale * s / cap), in log2 units; tanh from exp2 of a non-positive argument (no overflow)
            x = s * qk_scale
            # tensor first: Triton 3.9's interpreter keeps constexpr * tensor a constexpr, which exp2 refuses
            e = tl.exp2(tl.abs(x) * (-2.0 * LOG2E))
            t = (1.0 - e) / (1.0 + e)
            s = tl.where(x < 0, -t, t) * (softcap * LOG2E)
        else:
            s = s * qk_scale
        visible = (k_pos[None, :] <= q_pos[:, None]) & k_ok[None, :]
        if WINDOW:
            visible = visible & (q_pos[:, None] - k_pos[None, :] < sliding_window)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])  # [BLOCK_M, BLOCK_N]
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + (blk * stride_vb + slot * stride_vs + kv_head * stride_vh)[:, None] + offs_d[None, :],
                    mask=kv_mask, other=0.0)  # [BLOCK_N, HEAD_DIM_PAD]
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # a split that saw nothing for a row: output 0, weight 0
    o = acc / l_safe[:, None]
    o_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:
        # [BLOCK_M] into [splits, tokens, heads]; int64, as the forced splits of a long prefill can pass 2^31
        part = (split * num_tokens + tok).to(tl.int64) * (KV_HEADS * GROUP) + head
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=o_mask)
        tl.store(part_lse_ptr + part, tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_safe)), mask=row_ok)
        # the tile's last split to finish weighs every split's partial into out: the combine without a launch of its
        # own. Every thread's stores are done (the barrier) before one thread counts with release semantics; the
        # last count acquires them all, and its loads skip L1 (.cg), which the other programs' stores never reached
        tl.debug_barrier()
        counter = counters_ptr + seq_head * tl.num_programs(1) + q_tile
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            m_all = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: a split that saw nothing (-inf) weighs 0
            l_all = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, HEAD_DIM_PAD], tl.float32)
            for other in range(0, num_splits):
                part = (other * num_tokens + tok).to(tl.int64) * (KV_HEADS * GROUP) + head
                lse = tl.load(part_lse_ptr + part, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
                o = tl.load(part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=o_mask, other=0.0,
                            cache_modifier=".cg")
                m_new = tl.maximum(m_all, lse)
                alpha = tl.exp2(m_all - m_new)
                w = tl.exp2(lse - m_new)
                acc = acc * alpha[:, None] + o * w[:, None]
                l_all = l_all * alpha + w
                m_all = m_new
            o = acc / tl.where(l_all == 0.0, 1.0, l_all)[:, None]
            tl.store(out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                     o.to(out_ptr.dtype.element_ty), mask=o_mask)
            tl.atomic_xchg(counter, 0)  # ready for the next launch (a CUDA graph replays this one)
    else:
        tl.store(out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=o_mask)


@dataclass(frozen=True)
class Tile:
    """One launch's tile shape, chosen from host ints only (the same choice while a CUDA graph replays)."""

    block_m: int  # rows: BLOCK_Q tokens x GROUP heads, padded to a power of two >= 16 (tl.dot's smallest M)
    block_q: int  # query tokens per tile
    block_n: int  # keys per loop step
    head_dim_pad: int
    num_warps: int
    num_stages: int


def choose_tile(group: int, head_dim: int, max_query_len: int, element_size: int = 2) -> Tile:
    """Decode (and a short verify) fits a sequence's queries for one kv head in one tile of >= 16 rows; longer
    queries take 64-row tiles (wgmma on Hopper). 16-bit pools step 128 keys at head_dim 64, 64 at 128: 16 KB
    of K (and of V) per step, pipelined through shared memory (cp.async). Float32 pools (an exact mode, not the
    fast path) run tl.dot on plain FMAs, which keep both operands in registers: 16 rows and 8 KB steps are the
    largest tiles that compile for sm_90 without spilling (ptxas via Triton 3.6, head_dim 64 and 128)."""
    head_dim_pad = max(16, triton.next_power_of_2(head_dim))
    rows = max(16, triton.next_power_of_2(group * max(1, max_query_len)))
    rows = min(rows, 64 if element_size <= 2 else 16)
    block_m = max(rows, triton.next_power_of_2(group))
    block_n = min(128, max(16, (16384 // element_size) // head_dim_pad if element_size <= 2 else 2048 // head_dim_pad))
    return Tile(block_m=block_m, block_q=block_m // group, block_n=block_n, head_dim_pad=head_dim_pad,
                num_warps=4, num_stages=3 if block_m <= 16 else 2)


def tile_queries(group: int, head_dim: int, max_query_len: int, element_size: int = 2) -> list[int]:
    """The shortest query length of each tile choose_tile makes for queries of 1..max_query_len: steps of these
    lengths compile every tile the model's steps can take (the warm-up's)."""
    first: dict[Tile, int] = {}
    for query in range(1, max_query_len + 1):
        first.setdefault(choose_tile(group, head_dim, query, element_size), query)
    return sorted(first.values())


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return KERNEL_DEFAULT_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _interpreted() -> bool:
    """Whether triton.jit made these kernels interpreted ones (TRITON_INTERPRET=1 when this module was imported)."""
    return type(_paged_attention_kernel).__name__ == "InterpretedFunction"


def choose_splits(programs: int, max_kv_tiles: int, sms: int) -> int:
    """How many programs share one tile's key range: enough for KERNEL_PROGRAMS_PER_SM programs on every
    multiprocessor, no more than KERNEL_MIN_TILES_PER_SPLIT key tiles of the longest context each allows."""
    want = -(-KERNEL_PROGRAMS_PER_SM * sms // max(1, programs))
    return max(1, min(want, max_kv_tiles // KERNEL_MIN_TILES_PER_SPLIT, KERNEL_MAX_SPLITS))


@dataclass(frozen=True)
class Plan:
    tile: Tile
    q_tiles: int  # grid axis 1: ceil(max_query_len / BLOCK_Q)
    num_splits: int  # grid axis 2


def launch_plan(num_seqs: int, kv_heads: int, group: int, head_dim: int, element_size: int, block_size: int,
                table_width: int, max_query_len: int, max_context_len: int | None = None,
                num_splits: int | None = None, sms: int = KERNEL_DEFAULT_SMS) -> Plan:
    """The launch paged_attention_triton makes, from host ints only (benchmarks read it too)."""
    tile = choose_tile(group, head_dim, max_query_len, element_size)
    q_tiles = -(-max_query_len // tile.block_q)
    if num_splits is None:
        bound = max_context_len if max_context_len is not None else table_width * block_size
        num_splits = choose_splits(num_seqs * kv_heads * q_tiles, -(-bound // tile.block_n), sms)
    return Plan(tile=tile, q_tiles=q_tiles, num_splits=num_splits)


def paged_attention_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                           context_lens: torch.Tensor, query_start: torch.Tensor, *, scale: float,
                           softcap: float | None = None, sliding_window: int | None = None, max_query_len: int,
                           max_context_len: int | None = None, out: torch.Tensor | None = None,
                           num_splits: int | None = None) -> torch.Tensor:
    """[tokens, heads, head_dim] in q's dtype (into out when given): paged_attention_ref's result.

    q [tokens, heads, head_dim] (a view of a fused projection is fine: the last dim contiguous); pools
    [num_blocks, block_size, kv_heads, head_dim]; block_tables [seqs, max_blocks] int32/64, context_lens [seqs],
    query_start [seqs + 1], all on q's device. max_query_len bounds every sequence's query length (a host int:
    a query longer than it is not computed); max_context_len bounds the context (default: the block table's
    width), which only sizes the split; num_splits forces the split-K count (None: choose_splits)."""
    tokens, heads, head_dim = q.shape
    block_size, kv_heads = k_pool.shape[1], k_pool.shape[2]
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} kv heads")
    if k_pool.shape[3] != head_dim or v_pool.shape != k_pool.shape:
        raise ValueError(f"pools {tuple(k_pool.shape)} / {tuple(v_pool.shape)} do not hold head_dim {head_dim}")
    if q.device.type != "cuda" and not _interpreted():
        raise RuntimeError("paged_attention_triton runs on CUDA tensors (CPU tensors only under TRITON_INTERPRET=1, "
                           "set before this module is imported); paged_attention_ref is the CPU path")
    if q.stride(-1) != 1:
        q = q.contiguous()
    k_pool = k_pool if k_pool.stride(-1) == 1 else k_pool.contiguous()
    v_pool = v_pool if v_pool.stride(-1) == 1 else v_pool.contiguous()
    if out is None:
        out = torch.empty((tokens, heads, head_dim), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1:
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} must be q's shape and dtype, last dim contiguous")
    num_seqs = block_tables.shape[0]
    if num_seqs == 0 or tokens == 0 or max_query_len <= 0:
        return out

    group = heads // kv_heads
    plan = launch_plan(num_seqs, kv_heads, group, head_dim, k_pool.element_size(), block_size, block_tables.shape[1],
                       max_query_len, max_context_len, num_splits, _sm_count(q.device))
    tile, q_tiles, num_splits = plan.tile, plan.q_tiles, plan.num_splits
    split = num_splits > 1
    if split:
        part_out = torch.empty((num_splits, tokens, heads, head_dim), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, tokens, heads), dtype=torch.float32, device=q.device)
        counters = _split_counters(q.device, num_seqs * kv_heads * q_tiles)
    else:
        part_out = part_lse = counters = out  # unused: SPLIT is a constexpr, the stores are not compiled in
    dot_precision = "ieee" if k_pool.dtype == torch.float32 else "tf32"  # float32 pools: exact, not tf32

    _paged_attention_kernel[(num_seqs * kv_heads, q_tiles, num_splits)](
        q, k_pool, v_pool, out, part_out, part_lse, counters, block_tables, context_lens, query_start,
        float(scale), float(softcap or 0.0), int(sliding_window or 0), num_splits, tokens,
        q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
        v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), out.stride(0), out.stride(1), block_tables.stride(0),
        KV_HEADS=kv_heads, GROUP=group, HEAD_DIM=head_dim, HEAD_DIM_PAD=tile.head_dim_pad, BLOCK_SIZE=block_size,
        BLOCK_M=tile.block_m, BLOCK_Q=tile.block_q, BLOCK_N=tile.block_n, SPLIT=split, SOFTCAP=bool(softcap),
        WINDOW=bool(sliding_window), DOT_PRECISION=dot_precision, num_warps=tile.num_warps,
        num_stages=tile.num_stages)
    return out


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []  # outgrown counters: graphs captured over them still replay there


def _split_counters(device: torch.device, needed: int) -> torch.Tensor:
    """Zeroed int32 counters, one per (sequence, kv head, query tile) of a split launch, kept across calls: each
    launch leaves them at zero (a tile's last split resets its own), and a buffer made per call would be one more
    kernel a step (its memset). A split is chosen only while the programs are fewer than KERNEL_PROGRAMS_PER_SM per
    multiprocessor, so KERNEL_SPLIT_COUNTERS always suffice then; a forced num_splits over more tiles grows the
    buffer, never during a CUDA graph's capture (the new buffer's memset would only be recorded, not run)."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < needed:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"a split launch over {needed} tiles needs more counters than the "
                               f"{0 if have is None else have.numel()} made before this CUDA graph's capture; run it "
                               "once before capturing")
        if have is not None:
            _RETIRED.append(have)
        have = _COUNTERS[device] = torch.zeros(max(needed, KERNEL_SPLIT_COUNTERS), dtype=torch.int32, device=device)
    return have


def kv_bytes_read(context_lens: list[int], kv_heads: int, head_dim: int, element_size: int) -> int:
    """The fewest bytes one call must read: every held position's key and value once (q and out are
    negligible beside them at decode)."""
    return 2 * sum(context_lens) * kv_heads * head_dim * element_size


def patch_triton_interpreter() -> None:
    """Make Triton's interpreter (TRITON_INTERPRET=1: the CPU checks, nothing else) run these kernels as the GPU does.

    Three gaps of its runtime/interpreter.py (triton 3.6, unchanged in 3.9): it stores bfloat16 as the uint16
    bits and create_dot hands those to np.matmul as integers (garbage), so bf16 operands are upcast first, exactly
    (bf16 is the top half of a float32), which is what the tensor cores read; its float32 -> bfloat16 cast
    truncates where the GPU's (cvt.rn) rounds to nearest even, which doubled the CPU checks' bf16 error, so that
    cast rounds; and a scalar it loads is a one-element 1-d array, which `range(lo, hi, step)` turns into an int
    through int(array), an error since NumPy 2.4, so __index__ takes .item(). Idempotent; no effect on compiled
    kernels."""
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_trtbuild_patched", False):
        return
    original_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def up(x):
            if x.dtype.scalar != tl.bfloat16:
                return x
            return interpreter.TensorHandle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

        return original_dot(self, up(a), up(b), d, input_precision, max_num_imprecise_acc)

    original_cast = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar != tl.float32 or dst_type.scalar != tl.bfloat16:
            return original_cast(self, src, dst_type)
        bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
        rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        return interpreter.TensorHandle(rounded.astype(np.uint16), tl.bfloat16)

    original_patch_tensor = interpreter._patch_lang_tensor

    def patch_lang_tensor(tensor, scope):
        original_patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    create_dot._trtbuild_patched = True
    builder.create_dot = create_dot
    builder.cast_impl = cast_impl
    interpreter._patch_lang_tensor = patch_lang_tensor
