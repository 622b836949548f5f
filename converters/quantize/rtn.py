"""Round-to-nearest weight quantizers and the int4 packing of FORMAT.md.

Every function takes a float weight in torch's [out, in] layout and returns what the
checkpoint stores; `dequantize_*` are the exact inverses the graph computes, used by tests
and by the AWQ scale search to measure quantization error.
"""

from __future__ import annotations

import numpy as np

from engine_builder.util.errors import InputError

INT8_MAX = 127
INT4_MAX = 7  # symmetric: -7..7, so the scale is amax / 7 and -8 is never produced


def quantize_int8_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w: [out, in] float -> (q int8 [out, in], scale float32 [out])."""
    w = np.asarray(w, np.float32)
    scale = symmetric_scale(np.abs(w).max(axis=1), INT8_MAX)  # [out]
    return _round_clip(w / scale[:, None], INT8_MAX).astype(np.int8), scale


def symmetric_scale(amax: np.ndarray, qmax: int) -> np.ndarray:
    """amax / qmax as float32, so amax maps to qmax; 1.0 where amax is 0 (any scale stores zeros exactly,
    and 0 would divide by zero)."""
    return np.where(amax > 0, amax / qmax, 1.0).astype(np.float32)


def _round_clip(x: np.ndarray, qmax: int) -> np.ndarray:
    """round-to-nearest(x) in -qmax..qmax, in place in X (a fresh temporary): a large weight's float
    temporaries stay at one copy, not one per step."""
    np.rint(x, out=x)
    return np.clip(x, -qmax, qmax, out=x)


def dequantize_int8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """q: int8 [out, in], scale [out] (per channel) or [out, in / g] (blocked) -> [out, in] f32."""
    if np.ndim(scale) == 2:
        return dequantize_blocked(q, scale)
    return q.astype(np.float32) * np.asarray(scale, np.float32)[:, None]


def quantize_int8_blocked(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """w: [out, in] float -> (q int8 [out, in], scale float32 [out, in / group_size]).

    One scale per `group_size` consecutive input channels of a row (blocked DequantizeLinear along axis 1):
    a group's few large weights then coarsen only their own group's grid, not the whole row's."""
    return _quantize_blocked(w, group_size, INT8_MAX)


def check_group_size(in_features: int, group_size: int, name: str = "weight") -> None:
    if group_size <= 0 or in_features % group_size:
        raise InputError(f"--group-size {group_size} does not divide {name}'s {in_features} input channels; "
                         f"choose a group size that divides it (32, 64 or 128 usually do)")


def quantize_int4_blocked(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """w: [out, in] float -> (q int8 in -7..7 [out, in], scale float32 [out, in / group_size]).

    One scale per `group_size` consecutive input channels of a row (ONNX blocked
    DequantizeLinear along axis 1). Pack q with `pack_int4` for the checkpoint."""
    return _quantize_blocked(w, group_size, INT4_MAX)


def _quantize_blocked(w: np.ndarray, group_size: int, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric round-to-nearest in -qmax..qmax, one scale (amax / qmax) per group of input channels."""
    w = np.asarray(w, np.float32)
    out, inp = w.shape
    check_group_size(inp, group_size)
    groups = w.reshape(out, inp // group_size, group_size)  # [out, blocks, g]
    scale = symmetric_scale(np.abs(groups).max(axis=2), qmax)  # [out, blocks]
    q = _round_clip(groups / scale[:, :, None], qmax).astype(np.int8)
    return q.reshape(out, inp), scale


def dequantize_blocked(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None = None) -> np.ndarray:
    """q: [out, in] int values (signed, or unsigned with `zero`), scale/zero: [out, blocks] -> [out, in] f32.
    Any bit width: int4 and blocked int8 dequantize alike."""
    out, inp = q.shape
    blocks = scale.shape[1]
    qf = q.reshape(out, blocks, inp // blocks).astype(np.float32)
    if zero is not None:
        qf = qf - zero.astype(np.float32)[:, :, None]
    return (qf * np.asarray(scale, np.float32)[:, :, None]).reshape(out, inp)
