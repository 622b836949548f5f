"""llama.cpp's 4-bit block types (Q4_0, Q4_1, Q4_K) decoded into signed int4 codes, scales and offsets.

The layout of each block type and why the codes are signed: converters/quantize/gguf_blocks.py.
"""

from __future__ import annotations

import numpy as np

BLOCK = 32  # inputs per block, and so the checkpoint's group size
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q4_K": 144}  # bytes per block of 32 inputs (Q4_K: of 256)


def decode(blocks: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw GGUF rows, uint8 [rows, row bytes] -> (codes int8 -8..7 [rows, in], scale float32 [rows, in/32],
    offset float32 [rows, in/32]): w = codes * scale + offset."""
    rows = blocks.shape[0]
    b = blocks.reshape(rows, -1, BLOCK_BYTES[qtype])  # [rows, blocks, block bytes]
    d = _fp16(b[..., 0:2])  # [rows, blocks]
    if qtype == "Q4_K":
        from gguf.quants import Q4_K

        sc, mn = Q4_K.get_scale_min(b[..., 4:16].reshape(-1, 12))  # [rows * blocks, 8] each, 0..63
        scale = d[..., None] * sc.reshape(*d.shape, 8).astype(np.float32)  # [rows, blocks, 8]
        minimum = -_fp16(b[..., 2:4])[..., None] * mn.reshape(*d.shape, 8).astype(np.float32)
        nibbles = b[..., 16:].reshape(rows, -1, 4, 1, BLOCK)  # [rows, blocks, 4, 1, 32]
        runs = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=3)  # [rows, blocks, 4, 2, 32]: run 2j, 2j + 1
        return _signed(runs.reshape(rows, -1, BLOCK), scale.reshape(rows, -1), minimum.reshape(rows, -1))
    minimum = _fp16(b[..., 2:4]) if qtype == "Q4_1" else -8 * d
    nibbles = b[..., -BLOCK // 2:]  # [rows, blocks, 16]
    return _signed(np.concatenate([nibbles & 0xF, nibbles >> 4], axis=-1), d, minimum)


def _fp16(raw: np.ndarray) -> np.ndarray:
    """uint8 [..., 2] little-endian fp16 -> float32 [...]."""
    return raw.copy().view(np.float16)[..., 0].astype(np.float32)


def _signed(nibbles: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> tuple[np.ndarray, ...]:
    """Runs of w = scale * u + minimum (u: uint8 0..15 [rows, runs, 32], scale and minimum [rows, runs]) as
    (codes int8 -8..7 [rows, in], scale > 0, offset): w = scale * codes + offset.

    The scale a DequantizeLinear is handed is kept positive: a run of one value has scale 0 in the file
    and gets scale 1 with codes 0 (w = offset = minimum); Q4_0 stores a negative d when a run's largest
    magnitude is negative, and w = d * c + o = -d * (-c - 1) + (o - d), where -c - 1 (= ~c) stays in -8..7."""
    offset = minimum + 8 * scale  # [rows, runs]
    flat = scale == 0
    codes = np.where(flat[..., None], 8, nibbles).astype(np.int8) - 8  # [rows, runs, 32]
    scale = np.where(flat, np.float32(1), scale)
    negative = scale < 0
    codes = np.where(negative[..., None], ~codes, codes)
    return codes.reshape(len(codes), -1), np.abs(scale), np.where(negative, offset - scale, offset)
