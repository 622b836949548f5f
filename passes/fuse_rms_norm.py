"""fuse_rms_norm: the decomposed RMSNorm becomes RMSNormalization-23.

Matches what exporters and our emitter write:
    x * Reciprocal(Sqrt(ReduceMean(Pow(x, 2)) + eps)) * scale
with optional Casts to a wider compute type (fp16 models), Div(1, Sqrt) or Div(x, Sqrt) in
place of the Reciprocal, and gemma's (1 + w) scale, which stays an Add on the weight.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from passes.base import RewritePass, register_pass
from passes.constant_values import scalar

FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


class RmsNormFusion(pattern.RewriteRuleClassBase):
    def __init__(self, name: str, form: str, scale_first: bool):
        super().__init__(name)
        self.form, self.scale_first = form, scale_first

    def pattern(self, op, x, axes, epsilon, two, one, compute_dtype, target_dtype, scale):
        xc = pattern.OrValue([op.Cast(x, to=compute_dtype), x])
        mean_square = op.ReduceMean(op.Pow(xc, two), axes, keepdims=1)
        rms = op.Sqrt(op.Add(mean_square, epsilon))
        if self.form == "reciprocal":
            normalized = op.Mul(xc, op.Reciprocal(rms))
        elif self.form == "div_one":
            normalized = op.Mul(xc, op.Div(one, rms))
        else:
            normalized = op.Div(xc, rms)
        normalized = pattern.OrValue([op.Cast(normalized, to=target_dtype), normalized])
        return op.Mul(scale, normalized) if self.scale_first else op.Mul(normalized, scale)

    def check(self, context, x, axes, epsilon, two, one, scale, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if scalar(two) != 2.0:
            return result.fail("Pow exponent is not 2", two)
        if self.form == "div_one" and scalar(one) != 1.0:
            return result.fail("Div numerator is not 1", one)
        if scalar(epsilon) is None:
            return result.fail("epsilon is not a constant scalar", epsilon)
        if axes.const_value is None or axes.const_value.numpy().tolist() not in ([-1], [len(x.shape or ()) - 1]):
            return result.fail("ReduceMean is not over the last axis", axes)
        # dtypes and shapes are checked where known: a graph fresh from an emitter may lack them
        if any(v.dtype is not None and v.dtype not in FLOATS for v in (x, scale)):
            return result.fail("input or scale is not a float tensor", x)
        if scale.shape is not None and len(scale.shape) != 1:
            return result.fail("scale is not a 1-D tensor over the normalized axis", scale)
        return result

    def rewrite(self, op, x, epsilon, scale, compute_dtype=None, target_dtype=None, **_):
        # stash_type: the precision of the statistics; float32 unless the graph asked for wider
        stash = compute_dtype.as_int() if compute_dtype is not None else ir.DataType.FLOAT
        if compute_dtype is not None and target_dtype is None:
            # gemma: normalized and scaled in the wide type, output left wide (cast back later):
            # keep exactly that, so the output keeps its type
            x = op.Cast(x, to=compute_dtype.as_int())
            x_dtype = compute_dtype.as_int()
        else:
            x_dtype = x.dtype
        same = scale.dtype == x_dtype or None in (scale.dtype, x_dtype)
        out = op.RMSNormalization(x, scale if same else op.Cast(scale, to=x_dtype),
                                  axis=-1, epsilon=scalar(epsilon), stash_type=int(stash))
        if target_dtype is not None and x_dtype is not None and target_dtype.as_int() != x_dtype:
            out = op.Cast(out, to=target_dtype.as_int())
        return out


def rms_norm_rules() -> list[pattern.RewriteRule]:
    return [RmsNormFusion.rule(f"rms_norm_{form}_{order}", form=form, scale_first=order == "scale_first")
            for form in ("reciprocal", "div_one", "div") for order in ("scale_first", "scale_last")]


@register_pass
class FuseRmsNorm(RewritePass):
    name = "fuse_rms_norm"
    description = "decomposed RMSNorm -> RMSNormalization-23 (incl. gemma's (1+w) scale)"

    def rules(self) -> Sequence[pattern.RewriteRule]:
        return rms_norm_rules()
