"""Linear layers, float or quantized per converters/quantize/FORMAT.md, in portable ONNX.

    float      y = x @ W.T                                       W [out, in]
    quantized  y = x' @ Transpose(DequantizeLinear(W_q, scale[, zero]))
               x' = DequantizeLinear(QuantizeLinear(x, s), s)    only with activation quantization
    gguf       y += ReduceSum(x in blocks of 32) @ offset.T      a GGUF 4-bit block's w = q * scale + offset

The quantized weight stays [out, in] in rank0.safetensors and is referenced by byte offset:
int8 per channel (DQ axis 0) or blocked (DQ axis 1, block_size g), int4 blocked (an INT4/UINT4
view of the packed bytes, DQ axis 1, block_size g), fp8 e4m3 per tensor. TensorRT-RTX 1.7 fuses
DQ -> Transpose -> MatMul into one kernel (measured: one runtime_fusion "CastMulCastFc" layer per
linear; it refuses a Transpose *before* the DQ, "Quantized constant ... is only allowed before DQ").
onnxruntime does not fuse the int4 form itself, so lower_ort_matmulnbits turns it into MatMulNBits
for the onnxruntime twin.
"""

from __future__ import annotations

import onnx_ir as ir

from engine_builder.formats.quant_layout import weight_kind
from engine_builder.network.builder import GraphBuilder
from engine_builder.network.weights import CheckpointWeights

# activation quantization -> the QuantizeLinear output type
ACTIVATION_TYPES = {"int8": ir.DataType.INT8, "fp8": ir.DataType.FLOAT8E4M3FN}


def linear(b: GraphBuilder, w: CheckpointWeights, x: ir.Value, prefix: str, bias: ir.Value | None = None) -> ir.Value:
    """x [..., in] -> [..., out] through linear PREFIX ("layers.0.attn.qkv", "lm_head")."""
    q = w.quantization.for_linear(prefix)  # an int8 lm_head under an int4 body reads as int8_wo
    if prefix not in q.quantized:
        return b.linear(x, w[prefix + ".weight"], bias)
    kind = weight_kind(q)
    weight = w.stored(prefix + ".weight")  # [out, in] int8 / int4 / uint4 / fp8
    scale = w[prefix + ".weight_scale"]  # in the compute dtype, so DQ yields it
    if kind == "int8" and q.group_size is None:
        weight = b.op("DequantizeLinear", weight, scale, axis=0)  # scale [out]
    elif kind in ("int8", "int4"):
        zero = w.stored(prefix + ".weight_zero") if q.zero_point else None
        weight = b.op("DequantizeLinear", weight, scale, zero, axis=1, block_size=q.group_size)  # scale [out, blocks]
    else:
        weight = b.op("DequantizeLinear", weight, scale)  # per tensor
    if q.activation != "none":
        # static per-tensor activation scale (SmoothQuant int8, fp8): x_q = round(x / s), zero point 0
        s = w[prefix + ".input_scale"]
        x = b.op("DequantizeLinear", b.op("QuantizeLinear", x, s, output_dtype=ACTIVATION_TYPES[q.activation]), s)
    y = b.linear(x, weight, bias)
    return b.op("Add", y, _block_offsets(b, w, x, prefix, q.group_size)) if q.scheme == "gguf" else y


def _block_offsets(b: GraphBuilder, w: CheckpointWeights, x: ir.Value, prefix: str, block: int) -> ir.Value:
    """x [batch, seq, in] -> [batch, seq, out]: each block's offset times the sum of its inputs.

    sum_k x[k] * offset[o, k // block] is the offset's share of x @ W.T. Kept apart from the codes so
    the int4 part stays the DQ -> MatMul that TensorRT and MatMulNBits fuse (a DQ followed by an Add
    would be dequantized every step); it is a float GEMM 1/block the size of the int4 one."""
    blocks = b.op("Reshape", x, b.ints([0, 0, -1, block]))  # [batch, seq, in/block, block]
    sums = b.op("ReduceSum", blocks, b.ints([-1]), keepdims=0)  # [batch, seq, in/block]
    return b.linear(sums, w[prefix + ".weight_offset"])  # offset [out, in/block]
