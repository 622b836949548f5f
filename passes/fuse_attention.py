"""fuse_attention: decomposed scaled-dot-product attention becomes Attention-24.

Matches transformers' eager attention as our emitter and exporters write it:
    k = repeat_kv(K)  (Unsqueeze -> Expand -> Reshape, only with GQA)
    s = MatMul(q, Transpose(k, [0, 1, 3, 2])) * scale   [-> cap * Tanh(s / cap)]   + mask
    p = Softmax(s) (optionally Cast to float32 and back)
    out = MatMul(p, repeat_kv(V))
and rewrites it to Attention(q, K, V, mask, scale): Attention-24 does GQA natively, so the
repeated K/V disappear, and the additive mask carries causality, the static-cache validity and
sliding windows exactly as before. Soft-capped attention (gemma2) is fuse_attention_softcap's:
TensorRT's Attention rejects the softcap attribute, so only targets that take it run that pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from passes.base import RewritePass, register_pass
from passes.constant_values import scalar


def _repeat_kv(op, x, tag: str):
    repeated = op.Reshape(op.Expand(op.Unsqueeze(x, _name(tag, "axes")), _name(tag, "expand")),
                          _name(tag, "shape"))
    return pattern.OrValue([repeated, x], tag_var=f"{tag}_repeated")


def _name(tag: str, what: str) -> pattern.Var:
    return pattern.Var(f"{tag}_{what}")


class AttentionFusion(pattern.RewriteRuleClassBase):
    def __init__(self, softcap: bool):
        super().__init__(f"attention{'_softcap' if softcap else ''}")
        self.softcap = softcap

    def pattern(self, op, q, keys, values, scale, mask, cap, cap2, to_float, to_dtype):
        scores = op.MatMul(q, op.Transpose(_repeat_kv(op, keys, "k"), perm=[0, 1, 3, 2]))
        scores = op.Mul(scores, scale)  # [batch, heads, seq, kv_seq]
        if self.softcap:
            scores = op.Mul(op.Tanh(op.Div(scores, cap)), cap2)
        scores = op.Add(scores, mask)
        probs = pattern.OrValue([op.Cast(op.Softmax(op.Cast(scores, to=to_float), axis=-1), to=to_dtype),
                                 op.Softmax(scores, axis=-1)], tag_var="upcast")
        return op.MatMul(probs, _repeat_kv(op, values, "v"))

    def check(self, context, q, keys, values, scale, mask, cap=None, cap2=None, to_float=None,
              **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if scalar(scale) is None:
            return result.fail("scale is not a constant scalar", scale)
        if self.softcap and (scalar(cap) is None or scalar(cap) != scalar(cap2)):
            return result.fail("soft-cap divides and multiplies by different constants", cap)
        if to_float is not None and to_float.as_int() != ir.DataType.FLOAT:
            return result.fail("softmax is not upcast to float32", q)
        for v, what in ((q, "q"), (keys, "keys"), (values, "values")):
            if v.shape is not None and len(v.shape) != 4:
                return result.fail(f"{what} is not 4-D [batch, heads, seq, head_dim]", v)
        heads, kv_heads = (q.shape[1] if q.shape else None), (keys.shape[1] if keys.shape else None)
        if isinstance(heads, int) and isinstance(kv_heads, int) and heads % kv_heads:
            return result.fail(f"{heads} query heads are not a multiple of {kv_heads} KV heads", keys)
        return result

    def rewrite(self, op, q, keys, values, scale, mask, cap=None, **_):
        attrs = {"scale": scalar(scale)}
        if self.softcap:
            attrs["softcap"] = scalar(cap)
        # no softmax_precision even when the graph upcast: TensorRT rejects the attribute, and
        # its fused kernels (like onnxruntime's) accumulate the softmax in float32 anyway
        return op.Attention(q, keys, values, mask, **attrs)


@register_pass
class FuseAttention(RewritePass):
    name = "fuse_attention"
    description = "eager scaled-dot-product (GQA, mask) -> Attention-24"

    def rules(self) -> Sequence[pattern.RewriteRule]:
        return [AttentionFusion.rule(softcap=False)]
