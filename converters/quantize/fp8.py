"""Per-tensor FP8 (e4m3, OCP "fn": no infinities, max 448) weights and static activation scales.

One scale per tensor maps its absolute maximum onto e4m3's largest finite value. Bytes are
returned as uint8, the raw layout of safetensors' F8_E4M3 and ONNX's FLOAT8E4M3FN.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

E4M3_MAX = 448.0


def quantize_fp8(w: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """w: [out, in] float -> (q uint8 bytes of float8_e4m3fn [out, in], scale float32): w ~ float(q) * scale."""
    w = np.asarray(w, np.float32)
    scale = _scale(float(np.abs(w).max()) if w.size else 0.0)
    # clip: amax / (amax / 448) can round to a hair above 448, and e4m3fn has no infinity to absorb it
    q = np.clip(w / scale, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)  # round to nearest even
    return q.view(np.uint8), scale


def dequantize_fp8(q: np.ndarray, scale: float) -> np.ndarray:
    """The exact inverse the graph computes: uint8 e4m3 bytes [out, in] -> float32 [out, in]."""
    return np.asarray(q, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.float32(scale)


def activation_scale(absmax: float) -> np.float32:
    """The static per-tensor scale (P.input_scale) of an activation whose calibrated max |x| is ABSMAX."""
    return _scale(float(absmax))


def _scale(amax: float) -> np.float32:
    return np.float32(amax / E4M3_MAX if amax > 0 else 1.0)  # an all-zero tensor still needs a usable scale
