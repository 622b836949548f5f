"""SmoothQuant's migration of activation outliers into the weights (Xiao et al. 2023), for w8a8_sq.

A per-tensor int8 activation scale is set by the largest channel, so a few outlier channels
waste the range of all the others. Dividing channel j of x by s_j and multiplying column j of W
by s_j leaves x @ W^T unchanged and, with s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), balances
the two: alpha = 0.5 gives both the same per-channel range. The caller multiplies W by s,
folds 1 / s into the op before the linear (FORMAT.md), and stores `activation_scale`.
"""

from __future__ import annotations

import numpy as np

from converters.quantize.rtn import INT8_MAX
from engine_builder.util.errors import InputError

# SmoothQuant's clamp: no channel is divided by (almost) zero
MIN_SCALE = 1e-5


def smooth_scales(weight: np.ndarray, x_absmax: np.ndarray, alpha: float = 0.5) -> np.ndarray:
    """Per-input-channel smoothing scales s [in] f32 of WEIGHT [out, in] for activation maxima X_ABSMAX [in]."""
    if not 0.0 <= alpha <= 1.0:
        raise InputError(f"SmoothQuant alpha {alpha} is outside [0, 1]; 0.5 suits most models, "
                         f"raise it (e.g. 0.8) for models with strong activation outliers")
    w_absmax = np.maximum(np.abs(np.asarray(weight, np.float32)).max(axis=0), MIN_SCALE)  # [in]
    x_absmax = np.maximum(np.asarray(x_absmax, np.float32), MIN_SCALE)  # [in]
    scales = x_absmax ** alpha / w_absmax ** (1.0 - alpha)
    return np.maximum(scales, MIN_SCALE).astype(np.float32)


def activation_scale(x_absmax: np.ndarray, scales: np.ndarray) -> np.float32:
    """The static per-tensor int8 scale (P.input_scale) of the smoothed activation x / s.

    max_j(absmax_j / s_j) / 127, so the calibrated maximum quantizes to 127 and nothing clips."""
    amax = float(np.max(np.asarray(x_absmax, np.float32) / np.asarray(scales, np.float32)))
    return np.float32(amax / INT8_MAX if amax > 0 else 1.0)
