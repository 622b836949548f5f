"""fuse_gate_up: the gate and up projections of a GLU MLP become one MatMul and a Split."""

from __future__ import annotations

from passes.base import register_pass
from passes.parallel_matmul import ParallelMatMulPass


@register_pass
class FuseGateUp(ParallelMatMulPass):
    name = "fuse_gate_up"
    description = "two MatMuls sharing an input (gate/up) -> one MatMul + Split"
    fan_out = 2
    what = "gate_up"
