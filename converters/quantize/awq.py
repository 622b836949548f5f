"""AWQ's per-channel scale search (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization").

Input channels that carry large activations matter most, so they are scaled up before int4
rounding (their relative rounding error shrinks) and the activation is scaled down by the same
factor, which leaves x @ W^T unchanged in exact arithmetic:

    x @ W^T  =  (x / s) @ (W * s)^T  ~  (x / s) @ Q(W * s)^T

s = mean|x|^alpha, normalized as AutoAWQ's auto_scale does, with alpha picked from a grid by the
output error on calibration tokens. The caller quantizes W * s and folds 1 / s into the op
before the linear (FORMAT.md), so the graph needs no extra Mul. Then `search_clip` picks, per
row and group, a range below max|w| that minimizes the group's output error (AutoAWQ's
auto_clip); clamping W * s to it before rounding is all the caller does.
"""

from __future__ import annotations

import numpy as np

from converters.quantize.rtn import INT4_MAX, check_group_size, dequantize_blocked, quantize_int4_blocked

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
    effective = dequantize_blocked(q, q_scale) / scales  # [out, in]: what x meets after folding 1/s
    # the weight difference first: x @ (W - W_q)^T keeps the error's own precision in float32
    diff = (x @ (weight - effective).T).ravel()  # [n * out]
    return float(np.dot(diff, diff)) / diff.size  # a BLAS dot: ~10x faster than square-then-mean here


# AutoAWQ's auto_clip grid: clip each group's range to max|w| * (1 - i / CLIP_GRID), i < CLIP_STEPS,
# i.e. down to half the range at most
CLIP_GRID = 20
CLIP_STEPS = 10


def search_clip(weight: np.ndarray, sample: np.ndarray, group_size: int) -> np.ndarray:
    """Per (output row, group) clip limits [out, in / g] f32 of WEIGHT [out, in] for activations SAMPLE [n, in].

    AutoAWQ's auto_clip: rounding error of the many small weights shrinks when a group's range is
    clipped below its largest weight, at the cost of clipping that one. For each row's group the
    limit is picked from the grid by the error of that group's share of the output,
    ||x_g (w_g - Q(clip(w_g)))^T||^2 over the sample. Ratio 1 (no clip) is a candidate, so each
    group's error on the sample is never worse than plain round-to-nearest. Clamp WEIGHT to the
    limits (`clip`) before quantizing: the quantizer's amax then is the limit.
    """
    w = np.asarray(weight, np.float32)  # [out, in]
    x = np.asarray(sample, np.float32)  # [n, in]
    check_group_size(w.shape[1], group_size)
    out, blocks = w.shape[0], w.shape[1] // group_size
    limits = np.empty((out, blocks), np.float32)
    for b in range(blocks):
        cols = slice(b * group_size, (b + 1) * group_size)
        wg, xg = w[:, cols], x[:, cols]  # [out, g], [n, g]
        amax = np.abs(wg).max(axis=1)  # [out]
        best, best_error = amax.copy(), np.full(out, np.inf)
        for step in range(CLIP_STEPS):
            limit = amax * (1 - step / CLIP_GRID)  # [out]
            scale = np.where(limit > 0, limit / INT4_MAX, 1.0)[:, None]
            q = np.clip(np.rint(wg / scale), -INT4_MAX, INT4_MAX) * scale  # clipping at the limit, then RTN
            diff = xg @ (wg - q).T  # [n, out]
            error = np.einsum("no,no->o", diff, diff)
            better = error < best_error
            best[better], best_error[better] = limit[better], error[better]
        limits[:, b] = best
    return limits


def clip(weight: np.ndarray, limits: np.ndarray) -> np.ndarray:
    """WEIGHT [out, in] clamped per (row, group) to LIMITS [out, in / g]; a new array."""
    w = np.asarray(weight, np.float32)
    out, blocks = limits.shape
    bound = np.repeat(np.asarray(limits, np.float32), w.shape[1] // blocks, axis=1)  # [out, in]
    return np.clip(w, -bound, bound)
