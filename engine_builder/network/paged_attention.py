"""The paged KV layout's read and write (formats/graph_io.py, `--kv-layout paged`), in portable ops.

    write   pos = past_lengths[b] + t,  block = GatherElements(block_table, pos // B),  offset = pos % B
            present_pool = ScatterND(pool, (block, head, offset), new)      [num_blocks, kv_heads, B, head_dim]
    read    Gather(present_pool, block_table, axis 0)   [batch, max_blocks, kv_heads, B, head_dim]
            -> Transpose(0, 2, 1, 3, 4) -> Reshape      [batch, kv_heads, max_blocks * B, head_dim]

The gathered cache then feeds the same attention as the slot layout's buffer, against a mask over the
step's max_blocks * B logical positions. TensorScatter-24 (TensorRT's KV_CACHE_UPDATE) writes a linear
[batch, heads, seq] cache only (shared/DESIGN.md §4), so the write stays ScatterND, which TensorRT-RTX
builds as a scatter layer and onnxruntime updates in place when present_pool is bound over the pool.
The read costs one gather of the step's blocks per layer (and a transpose copy), which the slot layout
does not pay: benchmarks/paged_kv.py measures it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from engine_builder.network.builder import INT64, GraphBuilder
from engine_builder.network.masks import AttentionMasks, causal_biases


@dataclass(frozen=True)
class PagedMasks(AttentionMasks):
    """AttentionMasks over the logical positions of a block table; write_indices address the pool:
    [batch, kv_heads, seq, 3] (block, head, offset) of each new token."""

    block_table: ir.Value | None = None  # [batch, max_blocks] int64
    block_size: int = 16


def paged_masks(b: GraphBuilder, input_ids: ir.Value, past_lengths: ir.Value, block_table: ir.Value,
                kv_heads: int, block_size: int, sliding_window: int | None) -> PagedMasks:
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
            b.op("Unsqueeze", blocks, b.ints([1, 3])), head_idx, b.op("Unsqueeze", offsets, b.ints([1, 3])))),
            axis=-1, name="kv_write_indices")  # [batch, kv_heads, seq, 3]

        # logical positions 0 .. max_blocks * B - 1 of this step's table
        width = b.op("Mul", b.op("Shape", block_table, start=1, end=2), size)  # [1]
        slots = b.op("Sub", b.op("CumSum", b.op("ConstantOfShape", width, value=ir.tensor([1], dtype=INT64)),
                                 b.const(0, INT64)), one)  # [L]
        full, sliding = causal_biases(b, slots, query_pos, sliding_window)  # [batch, 1, seq, L]
    return PagedMasks(write_indices, full, sliding, block_table, block_size)


def paged_update(b: GraphBuilder, pool: ir.Value, new: ir.Value, masks: PagedMasks,
                 kv_heads: int, head_dim: int) -> tuple[ir.Value, ir.Value]:
    """Write NEW [batch, kv_heads, seq, head_dim] into POOL; (present pool, gathered cache
    [batch, kv_heads, max_blocks * B, head_dim]) in the pool's dtype."""
    present = b.op("ScatterND", pool, masks.write_indices, new)  # [num_blocks, kv_heads, B, head_dim]
    gathered = b.op("Gather", present, masks.block_table, axis=0)  # [batch, max_blocks, kv_heads, B, head_dim]
    gathered = b.op("Transpose", gathered, perm=[0, 2, 1, 3, 4])  # [batch, kv_heads, max_blocks, B, head_dim]
    return present, b.op("Reshape", gathered, b.ints([0, kv_heads, -1, head_dim]))
