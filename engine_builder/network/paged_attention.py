"""The paged KV layout's read, write and attention (formats/graph_io.py, `--kv-layout paged`), in portable ops.

The pool is head-major, [kv_heads, num_blocks, B, head_dim], so that the step's gathered cache comes out of
the Gather already in the order the attention's matmuls read, and nothing large is ever transposed:

    write   pos = past_lengths[b] + t,  block = GatherElements(block_table, pos // B),  offset = pos % B
            present_pool = ScatterND(pool, (head, block, offset), new)      [kv_heads, num_blocks, B, head_dim]
    read    Gather(present_pool, block_table, axis 1)   [kv_heads, batch, max_blocks, B, head_dim]
            -> Reshape                                   [kv_heads, batch, max_blocks * B, head_dim]  (no copy)
    attend  per KV head, its query heads' rows stacked: q [kv_heads, batch, rep * seq, head_dim] (a transpose
            of the step's queries, small), scores = q @ K^T + mask, softmax, @ V, and the output transposed
            back to [batch, seq, heads * head_dim] (small too)

The first version stored [num_blocks, kv_heads, B, head_dim] and fed the slot layout's attention, which
needs [batch, kv_heads, L, head_dim]: a transpose copy of every row's whole cached K and V per layer per
step, what made a batch-8 decode step 17 % slower than the slot layout (benchmarks/paged_kv.py). Stacking
a KV head's query heads as rows of one matmul (rep = heads / kv_heads) is also what grouped-query
attention kernels do, instead of repeating K and V per query head. TensorScatter-24 (TensorRT's
KV_CACHE_UPDATE) writes a linear [batch, heads, seq] cache only (shared/DESIGN.md §4), so the write stays
ScatterND, which TensorRT-RTX builds as a scatter layer and onnxruntime updates in place when present_pool
is bound over the pool.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from engine_builder.network.builder import FLOAT, INT64, GraphBuilder
from engine_builder.network.masks import AttentionMasks, causal_biases, image_block_visible


@dataclass(frozen=True)
class PagedMasks(AttentionMasks):
    """AttentionMasks over the logical positions of a block table; write_indices address the pool:
    [batch, kv_heads, seq, 3] (head, block, offset) of each new token. full / sliding are already laid out
    for paged_attend's score rows: [1, batch, rep * seq, L]."""

    block_table: ir.Value | None = None  # [batch, max_blocks] int64
    block_size: int = 16
    # [3] int64: (batch, seq, heads * head_dim), what paged_attend reshapes its output to. Built from
    # Shape(input_ids), so shape inference (data propagation) gives every layer's output, and through the
    # residual Adds the whole stream, the graph's own batch and seq dims: a constant [0, 0, -1]-style shape
    # after the head-major transposes gave fresh unknown dims, and then fuse_rotary added an Expand of the
    # cos/sin tables per rotary (4 per layer) and lower_ort_norms left half the residual norms unfused.
    output_shape: ir.Value | None = None


def paged_masks(b: GraphBuilder, input_ids: ir.Value, past_lengths: ir.Value, block_table: ir.Value,
                heads: int, kv_heads: int, block_size: int, sliding_window: int | None,
                head_dim: int, image_blocks: ir.Value | None = None) -> PagedMasks:
    with b.scope("masks"):
        # (row, step) index grids from cumulative sums of ones, as masks.py writes them
        ones = b.op("ConstantOfShape", b.op("Shape", input_ids), value=ir.tensor([1], dtype=INT64))
        one = b.const(1, INT64)
        steps = b.op("Sub", b.op("CumSum", ones, b.const(1, INT64)), one)  # [batch, seq]: t
        positions = b.op("Add", b.op("Unsqueeze", past_lengths, b.ints([1])), steps)  # [batch, seq]
        query_pos = b.op("Unsqueeze", positions, b.ints([1, 3]), name="query_positions")  # [batch, 1, seq, 1]

        size = b.const(block_size, INT64)
        blocks = b.op("GatherElements", block_table, b.op("Div", positions, size), axis=1)  # [batch, seq]
        offsets = b.op("Mod", positions, size)  # [batch, seq]
        index_shape = b.op("Concat", b.op("Shape", input_ids, start=0, end=1), b.ints([kv_heads]),
                           b.op("Shape", input_ids, start=1, end=2), b.ints([1]), axis=0)  # [4]
        head_idx = b.tensor(np.arange(kv_heads, dtype=np.int64).reshape(1, kv_heads, 1, 1),
                            "masks.kv_head_index")  # [1, kv_heads, 1, 1]
        write_indices = b.op("Concat", *(b.op("Expand", idx, index_shape) for idx in (
            head_idx, b.op("Unsqueeze", blocks, b.ints([1, 3])), b.op("Unsqueeze", offsets, b.ints([1, 3])))),
            axis=-1, name="kv_write_indices")  # [batch, kv_heads, seq, 3]

        # logical positions 0 .. max_blocks * B - 1 of this step's table
        width = b.op("Mul", b.op("Shape", block_table, start=1, end=2), size)  # [1]
        slots = b.op("Sub", b.op("CumSum", b.op("ConstantOfShape", width, value=ir.tensor([1], dtype=INT64)),
                                 b.const(0, INT64)), one)  # [L]
        both_ways = None if image_blocks is None else image_block_visible(b, image_blocks, positions, slots)
        full, sliding = causal_biases(b, slots, query_pos, sliding_window, both_ways)  # [batch, 1, seq, L]
        rep = heads // kv_heads
        # score row r * seq + t (query head kv * rep + r, step t) takes step t's mask: [1, batch, rep * seq, L]
        full, sliding = (None if m is None else b.op("Tile", b.op("Transpose", m, perm=[1, 0, 2, 3]),
                                                     b.ints([1, 1, rep, 1])) for m in (full, sliding))
        output_shape = b.op("Concat", b.op("Shape", input_ids), b.ints([heads * head_dim]), axis=0,
                            name="attention_output_shape")
    return PagedMasks(write_indices, full, sliding, block_table, block_size, output_shape)


def paged_update(b: GraphBuilder, pool: ir.Value, new: ir.Value, masks: PagedMasks,
                 kv_heads: int, head_dim: int) -> tuple[ir.Value, ir.Value]:
    """Write NEW [batch, kv_heads, seq, head_dim] into POOL; (present pool, gathered cache
    [kv_heads, batch, max_blocks * B, head_dim]) in the pool's dtype."""
    present = b.op("ScatterND", pool, masks.write_indices, new)  # [kv_heads, num_blocks, B, head_dim]
    gathered = b.op("Gather", present, masks.block_table, axis=1)  # [kv_heads, batch, max_blocks, B, head_dim]
    return present, b.op("Reshape", gathered, b.ints([kv_heads, 0, -1, head_dim]))


def head_major_scale(b: GraphBuilder, scale: ir.Value, kv_heads: int, head_dim: int) -> ir.Value:
    """An int8 cache's per-channel scale [1, kv_heads, 1, head_dim] for the gathered cache: [kv_heads, 1, 1, hd]."""
    return b.op("Reshape", scale, b.ints([kv_heads, 1, 1, head_dim]))


def paged_attend(b: GraphBuilder, q: ir.Value, keys: ir.Value, values: ir.Value, bias: ir.Value,
                 output_shape: ir.Value, *, heads: int, kv_heads: int, head_dim: int, scale: float,
                 softcap: float | None) -> ir.Value:
    """q [batch, heads, seq, head_dim]; keys / values [kv_heads, batch, L, head_dim] (paged_update's gathered
    cache); bias [1, batch, rep * seq, L] and output_shape (PagedMasks). Returns [batch, seq, heads * head_dim]:
    transformers' eager attention (repeat_kv, softmax(q k^T * scale [softcapped] + mask) v), rows grouped by KV head."""
    rep = heads // kv_heads
    q = b.op("Reshape", q, b.ints([0, kv_heads, rep, -1, head_dim]))  # [batch, kv_heads, rep, seq, hd]
    q = b.op("Transpose", q, perm=[1, 0, 2, 3, 4])  # [kv_heads, batch, rep, seq, hd]
    q = b.op("Reshape", q, b.ints([kv_heads, 0, -1, head_dim]))  # [kv_heads, batch, rep * seq, hd]
    scores = b.op("MatMul", q, b.op("Transpose", keys, perm=[0, 1, 3, 2]))  # [kv_heads, batch, rep * seq, L]
    scores = b.op("Mul", scores, b.const(scale))
    if softcap:  # gemma2: cap * tanh(scores / cap), before the mask
        cap = b.const(softcap)
        scores = b.op("Mul", b.op("Tanh", b.op("Div", scores, cap)), cap)
    scores = b.op("Add", scores, bias)
    if b.dtype == FLOAT:
        probs = b.op("Softmax", scores, axis=-1)
    else:  # transformers takes the softmax in float32
        probs = b.cast(b.op("Softmax", b.cast(scores, FLOAT), axis=-1), b.dtype)
    out = b.op("MatMul", probs, values)  # [kv_heads, batch, rep * seq, hd]
    out = b.op("Reshape", out, b.ints([kv_heads, 0, rep, -1, head_dim]))  # [kv_heads, batch, rep, seq, hd]
    out = b.op("Transpose", out, perm=[1, 3, 0, 2, 4])  # [batch, seq, kv_heads, rep, hd]
    return b.op("Reshape", out, output_shape)
