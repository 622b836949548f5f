"""One linear's float weight -> the tensors FORMAT.md stores for it under each scheme."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from converters.quantize import rtn

CHUNK_BYTES = 16 << 20  # float32 weight rows quantized per step

# (tensor name, dtype, shape), in the torch dtype spelling of converters/safetensors_writer.py
Layout = list[tuple[str, str, tuple[int, ...]]]


def linear_layout(prefix: str, out: int, inp: int, scheme: str, dtype: str, group_size: int | None) -> Layout:
    """What the checkpoint holds for quantized linear `prefix` of weight [out, inp]; `dtype` is the ckpt's.
    group_size None: one scale per output channel (int8)."""
    if scheme == "int8_wo":
        scale_shape = (out,) if group_size is None else (out, inp // group_size)
        return [(f"{prefix}.weight", "int8", (out, inp)), (f"{prefix}.weight_scale", dtype, scale_shape)]
    if scheme in ("int4_wo", "int4_awq"):
        return [(f"{prefix}.weight", "uint8", (out, inp // 2)),
                (f"{prefix}.weight_scale", dtype, (out, inp // group_size))]
    if scheme == "w8a8_sq":
        return [(f"{prefix}.weight", "int8", (out, inp)), (f"{prefix}.weight_scale", dtype, (out,)),
                (f"{prefix}.input_scale", "float32", ())]
    if scheme == "fp8":
        return [(f"{prefix}.weight", "float8_e4m3fn", (out, inp)), (f"{prefix}.weight_scale", "float32", ()),
                (f"{prefix}.input_scale", "float32", ())]
    raise ValueError(f"scheme {scheme!r} stores no quantized linears")


def quantize_linear(w: np.ndarray, scheme: str, group_size: int | None,
                    input_scale: float | None) -> list[np.ndarray]:
    """w: [out, in] float32 (scales already folded in) -> arrays in linear_layout's order (scales as float32)."""
    if scheme == "int8_wo" and group_size is not None:
        return list(_by_rows(w, lambda rows: rtn.quantize_int8_blocked(rows, group_size)))
    if scheme in ("int8_wo", "w8a8_sq"):
        q, scale = _by_rows(w, rtn.quantize_int8_per_channel)
        return [q, scale] if scheme == "int8_wo" else [q, scale, np.float32(input_scale)]
    if scheme in ("int4_wo", "int4_awq"):
        return list(_by_rows(w, lambda rows: _int4_packed(rows, group_size)))
    if scheme == "fp8":
        from converters.quantize import fp8

        q, scale = fp8.quantize_fp8(w)
        return [q, np.float32(scale), np.float32(input_scale)]
    raise ValueError(f"scheme {scheme!r} stores no quantized linears")


def _int4_packed(w: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    q, scale = rtn.quantize_int4_blocked(w, group_size)
    return rtn.pack_int4(q), scale


def _by_rows(w: np.ndarray, quantize: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) \
        -> tuple[np.ndarray, np.ndarray]:
    """Apply a row-wise quantizer a block of rows at a time: its float temporaries (several times the
    input) then stay at CHUNK_BYTES, not several times an embedding-sized lm_head. Each block's codes
    and scales go straight into the result, so the codes are never held twice (blocks plus a joined copy)."""
    rows = max(1, CHUNK_BYTES // (4 * w.shape[1]))
    q, scale = None, None
    for start in range(0, w.shape[0], rows):
        q_part, scale_part = quantize(w[start:start + rows])
        if q is None:  # shapes and dtypes from the first block: [out, ...] each
            q = np.empty((w.shape[0], *q_part.shape[1:]), q_part.dtype)
            scale = np.empty((w.shape[0], *scale_part.shape[1:]), scale_part.dtype)
        q[start:start + rows], scale[start:start + rows] = q_part, scale_part
    return q, scale
