"""fuse_kv_cache_update: the static-cache write becomes TensorScatter-24.

The decomposed write is a ScatterND whose indices put token t of sequence b at slot
past_lengths[b] + t of every KV head:
    positions = Unsqueeze(Unsqueeze(past_lengths, 1) + Range(0, seq, 1), [1, 3])
    idx = Concat(Expand(batch_index), Expand(head_index), Expand(positions))
    present = ScatterND(past, idx, update)
which is exactly TensorScatter(past, update, write_indices=past_lengths, axis=-2, mode="linear").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from passes.base import RewritePass, register_pass
from passes.constant_values import ints


def is_arange(value: ir.Value, axis: int) -> bool:
    """0, 1, 2, ... along `axis` of a [batch, seq] grid, in either form emitters write it:
    Range(0, n, 1) (possibly reshaped), or CumSum(ones, axis) - 1 (possibly unsqueezed)."""
    node = value.producer()
    while node is not None and node.op_type in ("Reshape", "Unsqueeze"):
        node = node.inputs[0].producer()
    if node is None:
        return False
    if node.op_type == "Range":
        return ints(node.inputs[0]) == [0] and ints(node.inputs[2]) == [1]
    if node.op_type != "Sub" or ints(node.inputs[1]) != [1]:
        return False
    cumsum = node.inputs[0].producer()
    if cumsum is None or cumsum.op_type != "CumSum" or ints(cumsum.inputs[1]) != [axis]:
        return False
    ones = cumsum.inputs[0].producer()
    fill = ones.attributes.get("value") if ones is not None and ones.op_type == "ConstantOfShape" else None
    return fill is not None and fill.value.numpy().reshape(-1).tolist() == [1]


class KvCacheWrite(pattern.RewriteRuleClassBase):
    def __init__(self):
        # the index tensor is shared by every layer; dead-code removal drops it after the last
        super().__init__("kv_cache_write", remove_nodes=False)

    def pattern(self, op, past, update, past_lengths, steps, batch_index, head_index, ax1, ax2, s1, s2, s3):
        positions = op.Add(op.Unsqueeze(past_lengths, ax1), steps)  # [batch, seq]
        query_pos = op.Unsqueeze(positions, ax2)  # [batch, 1, seq, 1]
        index = op.Concat(op.Expand(batch_index, s1), op.Expand(head_index, s2), op.Expand(query_pos, s3),
                          axis=-1)  # [batch, kv_heads, seq, 3]
        return op.ScatterND(past, index, update)

    def check(self, context, past, update, past_lengths, steps, batch_index, head_index, ax1, ax2,
              **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if ints(ax1) != [1] or ints(ax2) != [1, 3]:
            return result.fail("positions are not laid out as [batch, 1, seq, 1]", ax1)
        if not is_arange(steps, axis=1):
            return result.fail("token offsets are not Range(0, seq, 1)", steps)
        if not is_arange(batch_index, axis=0):
            return result.fail("batch index is not Range(0, batch, 1)", batch_index)
        heads = head_index.const_value.numpy() if head_index.const_value is not None else None
        if heads is None or not np.array_equal(heads.reshape(-1), np.arange(heads.size)):
            return result.fail("head index is not 0..kv_heads-1", head_index)
        if past.shape is not None and len(past.shape) != 4:
            return result.fail("cache is not [batch, kv_heads, max_seq, head_dim]", past)
        return result

    def rewrite(self, op, past, update, past_lengths, **_):
        return op.TensorScatter(past, update, past_lengths, axis=-2, mode="linear")


@register_pass
class FuseKvCacheUpdate(RewritePass):
    name = "fuse_kv_cache_update"
    description = "ScatterND write at past_lengths + t -> TensorScatter-24"

    def rules(self) -> Sequence[pattern.RewriteRule]:
        return [KvCacheWrite.rule()]
