"""fuse_gate_up: the gate and up projections of a GLU MLP become one MatMul and a Split."""

from __future__ import annotations

import onnx_ir as ir

from passes.base import Pass, register_pass
from passes.parallel_matmul import fuse_group, parallel_groups


@register_pass
class FuseGateUp(Pass):
    name = "fuse_gate_up"
    description = "two MatMuls sharing an input (gate/up) -> one MatMul + Split"

    def apply(self, model: ir.Model) -> int:
        groups = parallel_groups(model, fan_out=2)
        for i, nodes in enumerate(groups):
            fuse_group(model, nodes, f"fused_gate_up.{i}")
        return len(groups)

    def why_not(self, model: ir.Model) -> str | None:
        return ("no activation feeds exactly two MatMuls with constant weights of one input size "
                "(graphs from trtbuild's own emitter already read a fused gate_up weight)")
