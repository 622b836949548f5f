"""lower_ort_matmulnbits_exact: lower_ort_matmulnbits at accuracy level 0 (float activations).

Exact against the unfused quantized graph (the tests hold it to 1e-4), as fast as fp32 for int4
and ten times slower than fp32 for int8 in onnxruntime 1.31 (see lower_ort_matmulnbits). Pick it
in a recipe's passes.onnxruntime in place of lower_ort_matmulnbits to measure what level 4 costs.
"""

from __future__ import annotations

from passes.base import register_pass
from passes.lower_ort_matmulnbits import LowerOrtMatMulNBits


@register_pass
class LowerOrtMatMulNBitsExact(LowerOrtMatMulNBits):
    name = "lower_ort_matmulnbits_exact"
    description = "as lower_ort_matmulnbits, with float activations (accuracy_level 0)"
    accuracy_level = 0
