"""The int8 KV cache's arithmetic, in plain ONNX ops (`convert --kv-cache int8`, FORMAT.md).

    stored  = Cast(Clip(Round(x / scale), -128, 127), int8)     what the cache keeps
    x'      = Cast(stored, float32) * scale                     what attention reads

scale is per channel, [1, kv_heads, 1, head_dim] float32, calibrated (absmax / 127 of the keys
after rotary, and of the values). These are onnxruntime's GroupQueryAttention semantics for an
int8 cache with k_quant_type / v_quant_type PER_CHANNEL (saturating at -128, rounding half to
even), so the unfused graph is the numerics reference of lower_ort_attention's GQA form. Not
QuantizeLinear/DequantizeLinear: their per-axis scales are 1-D, and this one spans two axes.
The emitter (a GraphBuilder) and lower_ort_attention (an _Emitter) both call these with their
own `op` and the shared Clip bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import onnx_ir as ir

INT8_RANGE = (-128, 127)
Op = Callable[..., Any]  # op(op_type, *inputs, **attributes) -> ir.Value


def quantize(op: Op, x: ir.Value, scale: ir.Value, low: ir.Value, high: ir.Value) -> ir.Value:
    """x: float32 [batch, kv_heads, seq, head_dim] -> int8, same shape; low/high: float32 scalars."""
    return op("Cast", op("Clip", op("Round", op("Div", x, scale)), low, high), to=ir.DataType.INT8)


def dequantize(op: Op, stored: ir.Value, scale: ir.Value) -> ir.Value:
    """int8 [batch, kv_heads, max_seq, head_dim] -> float32, same shape."""
    return op("Mul", op("Cast", stored, to=ir.DataType.FLOAT), scale)
