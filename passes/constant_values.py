"""Reading the small constants patterns bind (axes, slice bounds, scales, epsilons)."""

from __future__ import annotations

import onnx_ir as ir


def ints(value: ir.Value | None) -> list[int] | None:
    """A constant's values as a flat list of ints, or None when it is not a constant."""
    if value is None or value.const_value is None:
        return None
    return [int(v) for v in value.const_value.numpy().reshape(-1)]


def scalar(value: ir.Value | None) -> float | None:
    """A one-element constant as a float, or None."""
    if value is None or value.const_value is None or value.const_value.size != 1:
        return None
    return float(value.const_value.numpy().reshape(()))
