"""The scales calibrated schemes derive from activation statistics, for folding and for Q/DQ of inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from converters.quantize.folding import SEARCH_ORDER, Folding, foldable
from engine_builder.config import ModelConfig

if TYPE_CHECKING:
    from converters.quantize.calibrate import CalibrationData

ReadWeight = Callable[[str], np.ndarray]  # checkpoint tensor name -> float32 array


def channel_scales(scheme: str, model: ModelConfig, quantized: tuple[str, ...], read: ReadWeight,
                   calib: CalibrationData | None, group_size: int) -> dict[str, np.ndarray]:
    """Linear prefix -> per-input-channel scale s [in] (int4_awq: AWQ search, w8a8_sq: SmoothQuant).

    Only quantized linears whose s can be folded get one; each is searched on its weight with the
    scales of its consumers already folded into its rows (SEARCH_ORDER), as it will be quantized."""
    if scheme not in ("int4_awq", "w8a8_sq"):
        return {}
    from converters.quantize import awq, smoothquant

    wanted = foldable(model) & set(quantized)
    scales: dict[str, np.ndarray] = {}
    for i in range(model.num_layers):
        for part in SEARCH_ORDER:
            prefix = f"layers.{i}.{part}"
            if prefix not in wanted:
                continue
            w = Folding(model, scales).apply(f"{prefix}.weight", read(f"{prefix}.weight"))  # [out, in]
            stats = calib.inputs[prefix]
            if scheme == "int4_awq":
                s = awq.search_scales(w, stats.sample, group_size)
            else:
                s = smoothquant.smooth_scales(w, stats.absmax)
            scales[prefix] = np.asarray(s, np.float32)  # [in]
    return scales


def input_scales(scheme: str, quantized: tuple[str, ...], calib: CalibrationData | None,
                 scales: dict[str, np.ndarray]) -> dict[str, float]:
    """Linear prefix -> static per-tensor scale of its input, x_q = round(x / scale) (w8a8_sq, fp8).

    The statistics were taken on the unfolded model; a folded input is x / s."""
    if scheme not in ("w8a8_sq", "fp8"):
        return {}
    from converters.quantize import fp8, smoothquant

    result = {}
    for prefix in quantized:
        absmax = calib.inputs[prefix].absmax  # [in]
        if scheme == "fp8":
            result[prefix] = float(fp8.activation_scale(float(absmax.max())))
        else:
            result[prefix] = float(smoothquant.activation_scale(absmax, scales.get(prefix, np.ones_like(absmax))))
    return result


def clipped_weight(prefix: str, w: np.ndarray, calib: CalibrationData, scales: dict[str, np.ndarray],
                   group_size: int) -> np.ndarray:
    """int4_awq: linear PREFIX's weight W [out, in], its AWQ scale already folded in, clamped to AWQ's
    searched per-group clip limits (awq.search_clip) for the input it will meet, x / s.

    Every quantized linear is clipped, o and lm_head too (a clamp needs no op to fold into), and
    so are qkv's q and k rows, which AutoAWQ leaves alone: on SmolLM2-135M int4 g64 clipping them
    too measured ppl 37.1 against 38.0 without (fp32 29.8; /tmp/q6me/t7.py)."""
    from converters.quantize import awq

    x = calib.inputs[prefix].sample  # [n, in]
    if prefix in scales:
        x = x / scales[prefix]
    return awq.clip(w, awq.search_clip(w, x, group_size))
