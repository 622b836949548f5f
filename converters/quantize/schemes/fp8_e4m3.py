"""fp8: e4m3 weights and static e4m3 activations, one scale per tensor each (converters/quantize/fp8.py),
calibrated for the activation scales."""

from __future__ import annotations

import numpy as np

from converters.quantize import fp8
from converters.quantize.scheme import Layout, QuantScheme, register_scheme


@register_scheme
class Fp8E4M3(QuantScheme):
    name = "fp8"
    activation = "fp8"
    calibrated = True

    def layout(self, prefix: str, out: int, inp: int, dtype: str, group_size: int | None) -> Layout:
        return [(f"{prefix}.weight", "float8_e4m3fn", (out, inp)), (f"{prefix}.weight_scale", "float32", ()),
                (f"{prefix}.input_scale", "float32", ())]

    def quantize(self, w: np.ndarray, group_size: int | None, input_scale: float | None) -> list[np.ndarray]:
        q, scale = fp8.quantize_fp8(w)
        return [q, np.float32(scale), np.float32(input_scale)]

    def input_scale(self, absmax: np.ndarray, smoothing: np.ndarray | None) -> float:
        return float(fp8.activation_scale(float(absmax.max())))
