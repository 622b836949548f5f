"""lower_ort_norms: residual Add + RMSNormalization -> com.microsoft SkipSimplifiedLayerNormalization.

    s = Add(x, skip); y = RMSNormalization(s, gamma)      # s also feeds the next residual Add
 -> y, _, _, s = SkipSimplifiedLayerNormalization(x, skip, gamma, epsilon)

One kernel reads x and skip once and writes both the normalized value and the residual sum.
In a SmolLM2-shaped decode step (onnxruntime 1.31 profile, 2 threads) it takes 12 us where
Add + RMSNormalization took 6 + 7 us at batch 1, and 17 us vs 9 + 11 us at batch 8: a small
win (~0.2% of the step), kept because it is exact and free. Only float32 is lowered: in 16-bit
graphs the unfused Add rounds the sum before normalizing and the fused kernel does not.

A lone RMSNormalization (layer 0, final norm, q/k norms) is left alone: onnxruntime 1.31 runs
RMSNormalization-23 and its SimplifiedLayerNormalization equally fast (0.50 vs 0.50 us at
[1, 1, 576], 1.6 vs 1.6 us at [8, 1, 576], 2.1 vs 2.1 us at [8, 1, 9, 64]), so the
non-standard op would buy nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from passes.base import MS_DOMAIN, OrtContribRewritePass, register_pass


class SkipRmsNorm(pattern.RewriteRuleClassBase):
    def pattern(self, op, x, skip, gamma):
        total = op.Add(x, skip)  # [batch, seq, hidden]
        normed = op.RMSNormalization(total, gamma, _allow_other_attributes=True, _outputs=["normed"])
        return normed, total

    def check(self, context, x, skip, gamma, normed, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        node = normed.producer()
        if x.dtype != ir.DataType.FLOAT or skip.dtype != ir.DataType.FLOAT:
            return result.fail("residual is not float32 (16-bit sums would round differently)", x)
        if gamma.dtype != ir.DataType.FLOAT or gamma.shape is None or len(gamma.shape) != 1:
            return result.fail("scale is not a float32 vector over the hidden axis", gamma)
        if x.shape is None or skip.shape is None or len(x.shape) != 3 or x.shape != skip.shape:
            return result.fail("residual operands are not two [batch, seq, hidden] tensors of one shape", x)
        axis = node.attributes.get_int("axis", -1)
        if axis not in (-1, 2):
            return result.fail(f"normalizes from axis {axis}, not the hidden axis", normed)
        if node.attributes.get_int("stash_type", 1) != ir.DataType.FLOAT:
            return result.fail("statistics are not taken in float32", normed)
        return result

    def rewrite(self, op, x, skip, gamma, normed, **_):
        epsilon = normed.producer().attributes.get_float("epsilon", 1e-5)
        out, _mean, _inv_std, total = op.SkipSimplifiedLayerNormalization(
            x, skip, gamma, epsilon=epsilon, _domain=MS_DOMAIN, _outputs=4)
        return out, total


@register_pass
class LowerOrtNorms(OrtContribRewritePass):
    name = "lower_ort_norms"
    description = "residual Add + RMSNormalization -> com.microsoft SkipSimplifiedLayerNormalization"

    def rules(self) -> Sequence[pattern.RewriteRule]:
        return [SkipRmsNorm.rule()]
