"""Per-tensor FP8 e4m3: round-trip error bounds, edge cases, and the bytes as onnxruntime's
DequantizeLinear reads them."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import onnxruntime as ort

from converters.quantize.fp8 import E4M3_MAX, activation_scale, dequantize_fp8, quantize_fp8

# e4m3 keeps 3 mantissa bits: a normal value rounds within 2^-4 of itself; below the smallest
# normal (2^-6) the spacing is the subnormal step 2^-9, so the error is at most half of it
REL_BOUND = 2.0 ** -4
SUBNORMAL_HALF_STEP = 2.0 ** -10


def assert_round_trip(x: np.ndarray, q: np.ndarray, scale: float) -> None:
    back = dequantize_fp8(q, scale)
    bound = np.maximum(np.abs(x) * REL_BOUND, scale * SUBNORMAL_HALF_STEP)
    assert np.all(np.abs(back - x) <= bound * (1 + 1e-6))
    assert np.isfinite(back).all()


def test_weight_round_trip_within_e4m3_bounds():
    rng = np.random.default_rng(0)
    # magnitudes spread over ~8 decades, so both normal and subnormal e4m3 values occur
    w = (rng.standard_normal((64, 96)) * 10.0 ** rng.uniform(-6, 2, (64, 96))).astype(np.float32)
    q, scale = quantize_fp8(w)
    assert q.dtype == np.uint8 and q.shape == w.shape
    assert scale.dtype == np.float32 and np.isclose(scale, np.abs(w).max() / E4M3_MAX, rtol=1e-7)
    assert_round_trip(w, q, scale)
    # the largest magnitude lands on e4m3's largest finite value
    assert np.abs(q.view(ml_dtypes.float8_e4m3fn).astype(np.float32)).max() == E4M3_MAX
    # normal values lose 2.3 % relative on average (measured; 3 mantissa bits)
    normal = np.abs(w) > scale * 2.0 ** -6
    rel = np.abs(dequantize_fp8(q, scale) - w)[normal] / np.abs(w)[normal]
    assert rel.mean() < 0.025


def test_zero_tensor_and_activation_scale():
    q, scale = quantize_fp8(np.zeros((4, 8), np.float32))
    assert scale == 1.0 and not q.any()  # 0x00 is +0 in e4m3
    assert activation_scale(0.0) == 1.0
    s = activation_scale(12.5)
    assert s.dtype == np.float32 and s == np.float32(12.5 / 448)
    # an activation at its calibrated max quantizes to 448 without overflowing to NaN
    x = np.array([[-12.5, 12.5, 0.3, -7e-4]], np.float32)
    q = np.clip(x / s, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert_round_trip(x, q, s)


def test_onnxruntime_dequantizes_the_bytes_exactly():
    """The uint8 bytes, read as an ONNX FLOAT8E4M3FN initializer, are what the graph will multiply."""
    w = np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32)
    q, scale = quantize_fp8(w)
    values = [ir.Value(name="q", type=ir.TensorType(ir.DataType.FLOAT8E4M3FN), shape=ir.Shape(q.shape),
                       const_value=ir.tensor(q.view(ml_dtypes.float8_e4m3fn), name="q")),
              ir.Value(name="scale", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([]),
                       const_value=ir.tensor(np.array(scale), name="scale"))]
    node = ir.Node("", "DequantizeLinear", values, num_outputs=1)
    out = node.outputs[0]
    out.name, out.type, out.shape = "w", ir.TensorType(ir.DataType.FLOAT), ir.Shape(q.shape)
    model = ir.Model(ir.Graph([], [out], nodes=[node], initializers=values, opset_imports={"": 21}), ir_version=10)
    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {})[0], dequantize_fp8(q, scale))
