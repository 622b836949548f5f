"""int4_wo: signed int4 weights, round to nearest, a scale per --group-size inputs (default 128)."""

from __future__ import annotations

import numpy as np

from converters.quantize import rtn
from converters.quantize.linear_quant import by_rows
from converters.quantize.scheme import Layout, QuantScheme, register_scheme
from engine_builder.formats.quant_packing import pack_int4


@register_scheme
class Int4WeightOnly(QuantScheme):
    name = "int4_wo"
    weight_bits = 4
    groups = "always"
    default_group = 128

    def layout(self, prefix: str, out: int, inp: int, dtype: str, group_size: int | None) -> Layout:
        assert group_size is not None  # groups "always": quant_options supplies the default
        return [(f"{prefix}.weight", "uint8", (out, inp // 2)),
                (f"{prefix}.weight_scale", dtype, (out, inp // group_size))]

    def quantize(self, w: np.ndarray, group_size: int | None, input_scale: float | None) -> list[np.ndarray]:
        assert group_size is not None

        def packed(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            q, scale = rtn.quantize_int4_blocked(rows, group_size)
            return pack_int4(q), scale

        return list(by_rows(w, packed))
