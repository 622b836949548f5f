"""w8a8_sq: int8 weights per output channel and static per-tensor int8 activations, SmoothQuant scales
folded out of each input (converters/quantize/smoothquant.py), calibrated."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from converters.quantize import rtn, smoothquant
from converters.quantize.linear_quant import by_rows
from converters.quantize.scheme import Layout, QuantScheme, register_scheme

if TYPE_CHECKING:
    from converters.quantize.calibrate import LinearInputStats


@register_scheme
class W8A8SmoothQuant(QuantScheme):
    name = "w8a8_sq"
    weight_bits = 8
    activation = "int8"
    calibrated = True
    smooths = True

    def layout(self, prefix: str, out: int, inp: int, dtype: str, group_size: int | None) -> Layout:
        return [(f"{prefix}.weight", "int8", (out, inp)), (f"{prefix}.weight_scale", dtype, (out,)),
                (f"{prefix}.input_scale", "float32", ())]

    def quantize(self, w: np.ndarray, group_size: int | None, input_scale: float | None) -> list[np.ndarray]:
        q, scale = by_rows(w, rtn.quantize_int8_per_channel)
        return [q, scale, np.float32(input_scale)]

    def smoothing_scales(self, w: np.ndarray, stats: LinearInputStats, group_size: int | None) -> np.ndarray:
        return smoothquant.smooth_scales(w, stats.absmax)

    def input_scale(self, absmax: np.ndarray, smoothing: np.ndarray | None) -> float:
        return float(smoothquant.activation_scale(absmax, np.ones_like(absmax) if smoothing is None else smoothing))
