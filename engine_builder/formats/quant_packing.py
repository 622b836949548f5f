"""How quantized values sit in safetensors bytes: int4 nibble packing and the float dtypes of scales.

The tensor table these serve is converters/quantize/FORMAT.md (checked by quant_layout.py).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def pack_int4(q: np.ndarray) -> np.ndarray:
    """[rows, n] int values in -8..7 (or 0..15) -> uint8 [rows, ceil(n/2)], even index in the low nibble."""
    q = np.asarray(q)
    if q.shape[-1] % 2:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (1,), q.dtype)], axis=-1)
    nibbles = (q.astype(np.int16) & 0xF).astype(np.uint8)
    return (nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)).astype(np.uint8)


def unpack_int4(packed: np.ndarray, n: int, signed: bool = True) -> np.ndarray:
    """uint8 [rows, ceil(n/2)] -> int8 [rows, n]: two's complement nibbles when signed, else 0..15."""
    packed = np.asarray(packed, np.uint8)
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.int8)
    out[..., 0::2] = packed & 0xF
    out[..., 1::2] = packed >> 4
    if signed:
        out = np.where(out >= 8, out - 16, out).astype(np.int8)
    return out[..., :n]
