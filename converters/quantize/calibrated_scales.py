"""The scales calibrated schemes derive from activation statistics, for folding and for Q/DQ of inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from converters.quantize.folding import SEARCH_ORDER, Folding, foldable
from engine_builder.formats.model_config import ModelConfig

if TYPE_CHECKING:
    from converters.quantize.calibrate import CalibrationData
    from converters.quantize.scheme import QuantScheme

ReadWeight = Callable[[str], np.ndarray]  # checkpoint tensor name -> float32 array


def channel_scales(scheme: QuantScheme, model: ModelConfig, quantized: tuple[str, ...], read: ReadWeight,
                   calib: CalibrationData | None, group_size: int | None) -> dict[str, np.ndarray]:
    """Linear prefix -> per-input-channel scale s [in] that SCHEME folds out of its input (AWQ, SmoothQuant).

    Only quantized linears whose s can be folded get one; each is searched on its weight with the
    scales of its consumers already folded into its rows (SEARCH_ORDER), as it will be quantized."""
    if not scheme.smooths or calib is None:
        return {}
    wanted = foldable(model) & set(quantized)
    scales: dict[str, np.ndarray] = {}
    for i in range(model.num_layers):
        for part in SEARCH_ORDER:
            prefix = f"layers.{i}.{part}"
            if prefix not in wanted:
                continue
            w = Folding(model, scales).apply(f"{prefix}.weight", read(f"{prefix}.weight"))  # [out, in]
            scales[prefix] = np.asarray(scheme.smoothing_scales(w, calib.inputs[prefix], group_size), np.float32)
    return scales


def input_scales(scheme: QuantScheme, quantized: tuple[str, ...], calib: CalibrationData | None,
                 scales: dict[str, np.ndarray]) -> dict[str, float]:
    """Linear prefix -> static per-tensor scale of its input, x_q = round(x / scale) (w8a8_sq, fp8).

    The statistics were taken on the unfolded model; a folded input is x / s."""
    if scheme.activation == "none" or calib is None:
        return {}
    return {prefix: scheme.input_scale(calib.inputs[prefix].absmax, scales.get(prefix)) for prefix in quantized}


def clipped_weight(scheme: QuantScheme, prefix: str, w: np.ndarray, calib: CalibrationData | None,
                   scales: dict[str, np.ndarray], group_size: int | None) -> np.ndarray:
    """Linear PREFIX's weight W [out, in], its smoothing scale already folded in, clamped by SCHEME's
    clip limits for the input it will meet, x / s (int4_awq: awq.search_clip); W as is otherwise."""
    if calib is None:
        return w
    x = calib.inputs[prefix].sample  # [n, in]
    if prefix in scales:
        x = x / scales[prefix]
    return scheme.clip(w, x, group_size)
