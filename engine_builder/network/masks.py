"""Per-graph tensors every attention layer shares: the KV write slots and the additive masks.

Query t of sequence b sits at absolute position p = past_lengths[b] + t, is written to cache
slot p, and sees slot j iff j <= p (slots above p are stale or not yet written) and, in a
sliding-window layer, j > p - window (transformers' definition).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from engine_builder.network.builder import INT64, GraphBuilder


@dataclass(frozen=True)
class AttentionMasks:
    write_indices: ir.Value  # [batch, kv_heads, seq, 3] int64 ScatterND (b, h, slot) of each new token
    full: ir.Value  # [batch, 1, seq, max_seq] compute dtype: 0 where visible, dtype min elsewhere
    sliding: ir.Value | None  # same, also hiding slots that left the window


def attention_masks(b: GraphBuilder, input_ids: ir.Value, past_lengths: ir.Value, kv_heads: int,
                    max_seq: int, sliding_window: int | None, image_blocks: ir.Value | None = None) -> AttentionMasks:
    """IMAGE_BLOCKS (a bidirectional vision model's image_mask [batch, seq]): each image's tokens also see each
    other (image_block_visible)."""
    with b.scope("masks"):
        # (row, step) index grids from cumulative sums of ones: unlike Range over a computed
        # length, they keep the symbolic [batch, seq] shape through shape inference
        ones = b.op("ConstantOfShape", b.op("Shape", input_ids), value=ir.tensor([1], dtype=INT64))
        one = b.const(1, INT64)
        rows = b.op("Sub", b.op("CumSum", ones, b.const(0, INT64)), one)  # [batch, seq]: b
        steps = b.op("Sub", b.op("CumSum", ones, b.const(1, INT64)), one)  # [batch, seq]: t
        positions = b.op("Add", b.op("Unsqueeze", past_lengths, b.ints([1])), steps)  # [batch, seq]
        query_pos = b.op("Unsqueeze", positions, b.ints([1, 3]), name="query_positions")  # [batch, 1, seq, 1]

        # ScatterND indices: every (batch, kv_head, new token) -> (b, h, past_lengths[b] + t)
        index_shape = b.op("Concat", b.op("Shape", input_ids, start=0, end=1), b.ints([kv_heads]),
                           b.op("Shape", input_ids, start=1, end=2), b.ints([1]), axis=0)  # [4]
        batch_idx = b.op("Unsqueeze", rows, b.ints([1, 3]))  # [batch, 1, seq, 1]
        head_idx = b.tensor(np.arange(kv_heads, dtype=np.int64).reshape(1, kv_heads, 1, 1),
                            "masks.kv_head_index")  # [1, kv_heads, 1, 1]
        write_indices = b.op("Concat", *(b.op("Expand", idx, index_shape)
                                         for idx in (batch_idx, head_idx, query_pos)),
                             axis=-1, name="kv_write_indices")  # [batch, kv_heads, seq, 3]

        slots = b.tensor(np.arange(max_seq, dtype=np.int64), "masks.kv_slots")  # [max_seq]
        both_ways = None if image_blocks is None else image_block_visible(b, image_blocks, positions, slots)
        full, sliding = causal_biases(b, slots, query_pos, sliding_window, both_ways)  # [batch, 1, seq, max_seq]
    return AttentionMasks(write_indices, full, sliding)


def causal_biases(b: GraphBuilder, slots: ir.Value, query_pos: ir.Value, sliding_window: int | None,
                  also_visible: ir.Value | None = None) -> tuple[ir.Value, ir.Value | None]:
    """Additive attention biases of cache positions SLOTS [L] for queries at QUERY_POS [batch, 1, seq, 1]:
    0 where visible (causal, or ALSO_VISIBLE [batch, 1, seq, L]; within the window for the sliding one), the
    dtype's lowest value elsewhere."""
    visible = b.op("LessOrEqual", slots, query_pos)  # [batch, 1, seq, L]
    if also_visible is not None:  # not the plain causal mask: no lowering pass takes it for one (attention_block.py)
        visible = b.op("Or", visible, also_visible)
    zero, hidden = b.const(0.0), b.const(float(ml_dtypes.finfo(b.dtype.numpy()).min))
    full = b.op("Where", visible, zero, hidden, name="causal_bias")
    sliding = None
    if sliding_window:
        window_start = b.op("Sub", query_pos, b.const(sliding_window, INT64))  # [batch, 1, seq, 1]
        in_window = b.op("And", visible, b.op("Greater", slots, window_start))
        sliding = b.op("Where", in_window, zero, hidden, name="sliding_bias")
    return full, sliding


def image_block_visible(b: GraphBuilder, image_mask: ir.Value, positions: ir.Value, slots: ir.Value) -> ir.Value:
    """Which cache positions SLOTS [L] a query sees beyond causality in a bidirectional vision model (Gemma 3): the
    tokens of its own image, ahead of it too. An image is a run of true in IMAGE_MASK [batch, seq] at this step's
    POSITIONS [batch, seq]; transformers' get_block_sequence_ids_for_mask numbers the runs the same way, and its
    masks are OR(causal, same image), and that inside the window on sliding layers. Only this step's tokens are
    numbered, so an image must be prefilled in one call (its tokens before the step are seen causally anyway).
    -> bool [batch, 1, seq, L]"""
    with b.scope("image_blocks"):
        first_col = b.op("Concat", b.op("Shape", image_mask, start=0, end=1), b.ints([1]), axis=0)  # [2]: batch, 1
        no = b.op("ConstantOfShape", first_col, value=ir.tensor([False]))  # [batch, 1]
        before = b.op("Concat", no, b.op("Slice", image_mask, b.ints([0]), b.ints([-1]), b.ints([1])),
                      axis=1)  # [batch, seq]: the previous token is an image's
        starts = b.op("And", image_mask, b.op("Not", before))  # [batch, seq]: an image's first token
        number = b.op("CumSum", b.cast(starts, INT64), b.const(1, INT64))  # [batch, seq]: 1, 2.. per image
        zero = b.const(0, INT64)
        image_id = b.op("Where", image_mask, number, zero)  # [batch, seq]: 0 for text tokens
        # the same numbers over cache positions: this step's tokens at their positions, 0 elsewhere
        slot_shape = b.op("Concat", b.op("Shape", image_mask, start=0, end=1), b.op("Shape", slots), axis=0)
        slot_id = b.op("ScatterElements", b.op("ConstantOfShape", slot_shape, value=ir.tensor([0], dtype=INT64)),
                       positions, image_id, axis=1)  # [batch, L]
        query_id = b.op("Unsqueeze", image_id, b.ints([1, 3]))  # [batch, 1, seq, 1]
        same = b.op("Equal", query_id, b.op("Unsqueeze", slot_id, b.ints([1, 2])))  # [batch, 1, seq, L]
        return b.op("And", same, b.op("Greater", query_id, zero), name="same_image")
