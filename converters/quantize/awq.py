"""AWQ's per-channel scale search (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization").

Input channels that carry large activations matter most, so they are scaled up before int4
rounding (their relative rounding error shrinks) and the activation is scaled down by the same
factor, which leaves x @ W^T unchanged in exact arithmetic:

    x @ W^T  =  (x / s) @ (W * s)^T  ~  (x / s) @ Q(W * s)^T

s = mean|x|^alpha, normalized as AutoAWQ's auto_scale does, with alpha picked from a grid by the
output error on calibration tokens. The caller quantizes W * s and folds 1 / s into the op
before the linear (FORMAT.md), so the graph needs no extra Mul.
"""

from __future__ import annotations

import numpy as np

from converters.quantize.rtn import check_group_size, dequantize_int4_blocked, quantize_int4_blocked

GRID = 20  # alpha in 0, 1/20, ..., 19/20, as AutoAWQ
# AutoAWQ's floor on mean|x|^alpha: a channel that never activates must not get a zero scale
MIN_SCALE = 1e-4


def search_scales(weight: np.ndarray, sample: np.ndarray, group_size: int) -> np.ndarray:
    """The AWQ input-channel scales s [in] f32 of WEIGHT [out, in] for activations SAMPLE [n, in].

    Minimizes ||x W^T - (x / s) Q(W s)^T||^2 over the sample, Q = symmetric int4 at GROUP_SIZE.
    alpha = 0 is a candidate and gives s = 1 (plain round-to-nearest), so the result is never
    worse than RTN on the sample.
    """
    w = np.asarray(weight, np.float32)  # [out, in]
    x = np.asarray(sample, np.float32)  # [n, in]
    check_group_size(w.shape[1], group_size)
    x_mean = np.abs(x).mean(axis=0)  # [in]
    best_scales, best_error = np.ones_like(x_mean), np.inf
    for step in range(GRID):
        scales = np.maximum(x_mean ** (step / GRID), MIN_SCALE)
        # centre the scales around 1 so W * s keeps its magnitude (alpha = 0 leaves exactly 1)
        scales = (scales / np.sqrt(scales.max() * scales.min())).astype(np.float32)
        error = output_error(w, x, scales, group_size)
        if error < best_error:
            best_scales, best_error = scales, error
    return best_scales


def output_error(weight: np.ndarray, x: np.ndarray, scales: np.ndarray, group_size: int) -> float:
    """Mean squared error of x @ W^T against (x / s) @ Q(W * s)^T, for x [n, in] and s [in]."""
    q, q_scale = quantize_int4_blocked(weight * scales, group_size)
    effective = dequantize_int4_blocked(q, q_scale) / scales  # [out, in]: what x meets after folding 1/s
    # the weight difference first: x @ (W - W_q)^T keeps the error's own precision in float32
    diff = (x @ (weight - effective).T).ravel()  # [n * out]
    return float(np.dot(diff, diff)) / diff.size  # a BLAS dot: ~10x faster than square-then-mean here
