"""fuse_rotary: HF's `x * cos + rotate_half(x) * sin` becomes RotaryEmbedding-23.

Matches the rotate-half form both our emitter and torch's dynamo exporter write:
    emb = Concat(freqs, freqs); cos = Unsqueeze([Cast]([Mul](Cos(emb), attention_factor)), 1)
    Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, h, end)), Slice(x, 0, h)), sin))
the interleaved (GPT-J) form, and, as a second step, partial rotary
    Concat(RotaryEmbedding(Slice(x, 0, d)), Slice(x, d, end)) -> RotaryEmbedding(x, rotary_embedding_dim=d)
RotaryEmbedding-23 without position_ids takes cos/sin as [batch, seq, dim/2]: the table
before it was doubled, so the rewrite computes Cos/Sin of `freqs` itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from passes.base import RewritePass, register_pass
from passes.constant_values import ints

INT64_MAX = np.iinfo(np.int64).max


def _last_axis(axes: ir.Value, rank: int | None) -> bool:
    return ints(axes) in ([-1], [rank - 1] if rank else [-1])


def _unit_steps(slice_out: ir.Value) -> bool:
    node = slice_out.producer()
    return len(node.inputs) < 5 or ints(node.inputs[4]) == [1]


def _table(op, x: ir.Value, factor: ir.Value | None, to: ir.Attr | None) -> ir.Value:
    if factor is not None:
        x = op.Mul(x, factor)
    return op.Cast(x, to=to.as_int()) if to is not None else x


class _RotaryBase(pattern.RewriteRuleClassBase):
    """cos/sin tables shared by the rotate-half and interleaved rules."""

    def __init__(self, name: str | None = None):
        # every layer reads the same tables: leave them for dead-code removal once all are fused
        super().__init__(name, remove_nodes=False)

    def tables(self, op, emb, cos_factor, sin_factor, cos_to, sin_to, cos_axes, sin_axes):
        cos = pattern.OrValue([op.Mul(op.Cos(emb), cos_factor), op.Cos(emb)])
        sin = pattern.OrValue([op.Mul(op.Sin(emb), sin_factor), op.Sin(emb)])
        # tag_var: onnxscript's backtracking OrValue needs one (it binds which alternative matched)
        cos = pattern.OrValue([op.Cast(cos, to=cos_to), cos], tag_var="cos_cast")
        sin = pattern.OrValue([op.Cast(sin, to=sin_to), sin], tag_var="sin_cast")
        return op.Unsqueeze(cos, cos_axes), op.Unsqueeze(sin, sin_axes)

    def check_tables(self, result, x, cos_axes, sin_axes, cos_factor, sin_factor) -> bool:
        if ints(cos_axes) != [1] or ints(sin_axes) != [1]:
            result.fail("cos/sin are not unsqueezed at the heads axis (1)", cos_axes)
            return False
        if (cos_factor is None) != (sin_factor is None) or (cos_factor is not None and not np.array_equal(
                cos_factor.const_value.numpy() if cos_factor.const_value is not None else np.nan,
                sin_factor.const_value.numpy() if sin_factor.const_value is not None else np.nan)):
            result.fail("cos and sin are scaled differently", cos_factor)
            return False
        if x.shape is not None and len(x.shape) != 4:
            result.fail("input is not [batch, heads, seq, head_dim]", x)
            return False
        return True

    def rewrite(self, op, x, freqs, cos_factor=None, sin_factor=None, cos_to=None, sin_to=None, **_):
        cos = _table(op, op.Cos(freqs), cos_factor, cos_to)  # [batch, seq, dim/2]
        sin = _table(op, op.Sin(freqs), sin_factor, sin_to)
        x_batch = x.shape[0] if x.shape is not None else None
        f_batch = freqs.shape[0] if freqs.shape is not None else None
        if x_batch is None or x_batch != f_batch:
            # exporters build the table from arange positions, [1, seq, dim/2], and let Mul
            # broadcast it; RotaryEmbedding wants one row per sequence
            rows = op.Concat(op.Shape(x, start=0, end=1), op.Shape(freqs, start=1), axis=0)
            cos, sin = op.Expand(cos, rows), op.Expand(sin, rows)
        return op.RotaryEmbedding(x, cos, sin, interleaved=int(self.interleaved))


class RotateHalfRotary(_RotaryBase):
    interleaved = False

    def pattern(self, op, x, freqs, start1, half1, axes1, half2, end2, axes2,
                cos_factor, sin_factor, cos_to, sin_to, cos_axes, sin_axes):
        cos, sin = self.tables(op, op.Concat(freqs, freqs, axis=-1), cos_factor, sin_factor,
                               cos_to, sin_to, cos_axes, sin_axes)
        x1 = op.Slice(x, start1, half1, axes1, _allow_other_inputs=True, _outputs=["x1"])
        x2 = op.Slice(x, half2, end2, axes2, _allow_other_inputs=True, _outputs=["x2"])
        rotated = op.Concat(op.Neg(x2), x1, axis=-1)
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def check(self, context, x, freqs, start1, half1, axes1, half2, end2, axes2, x1, x2,
              cos_factor=None, sin_factor=None, cos_axes=None, sin_axes=None, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if not self.check_tables(result, x, cos_axes, sin_axes, cos_factor, sin_factor):
            return result
        rank = len(x.shape) if x.shape is not None else None
        if not (_last_axis(axes1, rank) and _last_axis(axes2, rank) and _unit_steps(x1) and _unit_steps(x2)):
            return result.fail("rotate_half does not slice the last axis with step 1", x)
        h = ints(half1)
        if ints(start1) != [0] or h is None or ints(half2) != h:
            return result.fail("rotate_half does not split the head dim into two halves", half1)
        head_dim = x.shape[-1] if x.shape is not None else None
        if isinstance(head_dim, int) and head_dim != 2 * h[0]:
            return result.fail(f"split point {h[0]} is not half of head_dim {head_dim}", half1)
        end = ints(end2)
        if end is None or end[0] < 2 * h[0]:
            return result.fail("second half does not run to the end of the head dim", end2)
        half_table = freqs.shape[-1] if freqs.shape is not None else None
        if isinstance(half_table, int) and half_table != h[0]:
            return result.fail(f"frequency table has {half_table} columns, expected {h[0]}", freqs)
        return result


class InterleavedRotary(_RotaryBase):
    """GPT-J layout: channel pairs (2i, 2i+1) rotate together; the table repeats each frequency."""

    interleaved = True

    def pattern(self, op, x, freqs, pair_shape, emb_shape, freq_axes, pairs_shape, out_shape,
                s0, e0, a0, s1, e1, a1, cos_factor, sin_factor, cos_to, sin_to, cos_axes, sin_axes):
        f = op.Unsqueeze(freqs, freq_axes)
        emb = op.Reshape(op.Concat(f, f, axis=-1), emb_shape)
        cos, sin = self.tables(op, emb, cos_factor, sin_factor, cos_to, sin_to, cos_axes, sin_axes)
        pairs = op.Reshape(x, pairs_shape)
        even = op.Slice(pairs, s0, e0, a0)
        odd = op.Slice(pairs, s1, e1, a1)
        rotated = op.Reshape(op.Concat(op.Neg(odd), even, axis=-1), out_shape)
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def check(self, context, x, freq_axes, s0, e0, a0, s1, e1, a1, cos_factor=None, sin_factor=None,
              cos_axes=None, sin_axes=None, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if not self.check_tables(result, x, cos_axes, sin_axes, cos_factor, sin_factor):
            return result
        if ints(freq_axes) != [-1] or [ints(s0), ints(e0), ints(s1), ints(e1)] != [[0], [1], [1], [2]]:
            return result.fail("pairs are not split into even and odd channels", x)
        if ints(a0) != [-1] or ints(a1) != [-1]:
            return result.fail("pair split is not on the last axis", a0)
        return result


class PartialRotary(pattern.RewriteRuleClassBase):
    """Concat(RotaryEmbedding(Slice(x, 0, d)), Slice(x, d, end)) -> RotaryEmbedding(x, rotary_embedding_dim=d)."""

    def pattern(self, op, x, start1, end1, axes1, start2, end2, axes2):
        x_rot = op.Slice(x, start1, end1, axes1, _allow_other_inputs=True)
        rotated = op.RotaryEmbedding(x_rot, _allow_other_inputs=True, _allow_other_attributes=True,
                                     _outputs=["rotated"])
        x_pass = op.Slice(x, start2, end2, axes2, _allow_other_inputs=True)
        return op.Concat(rotated, x_pass, axis=-1)

    def check(self, context, x, start1, end1, axes1, start2, end2, axes2, rotated, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        rank = len(x.shape) if x.shape is not None else None
        if not (_last_axis(axes1, rank) and _last_axis(axes2, rank)):
            return result.fail("partial rotary slices are not on the last axis", x)
        d = ints(end1)
        if ints(start1) != [0] or d is None or ints(start2) != d or (ints(end2) or [0])[0] < INT64_MAX // 2:
            return result.fail("slices do not split the head dim at one point", end1)
        if "rotary_embedding_dim" in rotated.producer().attributes:
            return result.fail("RotaryEmbedding already has rotary_embedding_dim", rotated)
        return result

    def rewrite(self, op, x, end1, rotated, **_):
        node = rotated.producer()
        attrs = {k: v.value for k, v in node.attributes.items()}
        return op.RotaryEmbedding(x, *node.inputs[1:], **attrs,
                                  rotary_embedding_dim=ints(end1)[0])


@register_pass
class FuseRotary(RewritePass):
    name = "fuse_rotary"
    description = "rotate-half / interleaved / partial rotary -> RotaryEmbedding-23"

    def rules(self) -> Sequence[pattern.RewriteRule]:
        full = pattern.RewriteRuleSet([RotateHalfRotary.rule(), InterleavedRotary.rule()], commute=True).rules
        return [*full, PartialRotary.rule()]

    def apply(self, model: ir.Model) -> int:
        # two sweeps: the partial-rotary rule needs the RotaryEmbedding the first sweep makes;
        # the count is the number of rotary applications fused, not the refinements
        *full, partial = self.rules()
        count = pattern.RewriteRuleSet(full).apply_to_model(model)
        if count:
            pattern.RewriteRuleSet([partial]).apply_to_model(model)
            # every layer made its own Cos/Sin of the same table: keep one
            ir.passes.common.CommonSubexpressionEliminationPass()(model)
        return count
