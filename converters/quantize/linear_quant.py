"""Quantize a linear's rows a block at a time, so a scheme's float temporaries stay small."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

CHUNK_BYTES = 16 << 20  # float32 weight rows quantized per step


def by_rows(w: np.ndarray, quantize: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) \
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
