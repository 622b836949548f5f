"""lower_ort_matmul_transb: MatMul(x, Transpose(W)) on a float32 weight -> com.microsoft FusedMatMul(x, W, transB=1).

    y = MatMul(x, Transpose(W [out, in], perm=[1, 0]))      # the emitter's float linear (network/builder.py)
 -> y = FusedMatMul(x, W, transB=1)

The emitter keeps weights [out, in] as rank0.safetensors stores them (their bytes are referenced, never
rewritten) behind a Transpose node. onnxruntime constant-folds that Transpose at session creation: a
transposed copy of every weight (536 MB on SmolLM2 float32), made and then packed again for its GEMM
kernel. Measured on SmolLM2-135M float32, onnxruntime 1.32, 2 cores: session creation 0.84-1.3 s with the
Transposes, 0.55-0.6 s with FusedMatMul, which packs W straight from the mapped file (its prepack takes
transB); peak RSS at load 727 -> 684 MB, anonymous memory 586 -> 543 MB; the same tokens and logits, and
decode steps of the same speed within noise (benchmarks/matmul_transb.py; README "Cold start").

Only float32 MatMuls whose weight is an initializer (or a Cast of one: a bf16 checkpoint run in float32)
are lowered: the 16-bit twins keep the portable form, and a DequantizeLinear weight is left to
lower_ort_matmulnbits. The TensorRT graph keeps the Transpose, which its builder folds into the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from passes.base import MS_DOMAIN, OrtContribRewritePass, register_pass


def _is_weight(value: ir.Value) -> bool:
    """An initializer, or a Cast of one."""
    producer = value.producer()
    if producer is not None and producer.op_type == "Cast" and producer.domain in ("", "ai.onnx"):
        value = producer.inputs[0]
        producer = value.producer() if value is not None else None
    return value is not None and producer is None and value.const_value is not None


class TransposedWeightMatMul(pattern.RewriteRuleClassBase):
    def pattern(self, op, x, w):
        return op.MatMul(x, op.Transpose(w, perm=[1, 0]))  # x [..., in], w [out, in]

    def check(self, context, x, w, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.dtype != ir.DataType.FLOAT or w.dtype != ir.DataType.FLOAT:
            return result.fail("not a float32 MatMul (the 16-bit twins keep the portable form)", x)
        if w.shape is None or len(w.shape) != 2:
            return result.fail("the transposed operand is not a 2-D weight", w)
        if not _is_weight(w):
            return result.fail("the transposed operand is not an initializer (or a Cast of one)", w)
        return result

    def rewrite(self, op, x, w, **_):
        return op.FusedMatMul(x, w, transB=1, _domain=MS_DOMAIN)


@register_pass
class LowerOrtMatMulTransB(OrtContribRewritePass):
    name = "lower_ort_matmul_transb"
    description = "MatMul(x, Transpose(W)) on a float32 weight -> com.microsoft FusedMatMul(x, W, transB=1)"

    def rules(self) -> Sequence[pattern.RewriteRule]:
        return [TransposedWeightMatMul.rule()]
