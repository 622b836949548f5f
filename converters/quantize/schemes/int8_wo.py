"""int8_wo: int8 weights, round to nearest, a scale per output channel or per --group-size inputs."""

from __future__ import annotations

import numpy as np

from converters.quantize import rtn
from converters.quantize.linear_quant import by_rows
from converters.quantize.scheme import Layout, QuantScheme, register_scheme


@register_scheme
class Int8WeightOnly(QuantScheme):
    name = "int8_wo"
    weight_bits = 8
    groups = "optional"

    def layout(self, prefix: str, out: int, inp: int, dtype: str, group_size: int | None) -> Layout:
        scale_shape = (out,) if group_size is None else (out, inp // group_size)
        return [(f"{prefix}.weight", "int8", (out, inp)), (f"{prefix}.weight_scale", dtype, scale_shape)]

    def quantize(self, w: np.ndarray, group_size: int | None, input_scale: float | None) -> list[np.ndarray]:
        if group_size is None:
            return list(by_rows(w, rtn.quantize_int8_per_channel))
        return list(by_rows(w, lambda rows: rtn.quantize_int8_blocked(rows, group_size)))
