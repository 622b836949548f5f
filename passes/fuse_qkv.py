"""fuse_qkv: the q, k and v projections of a layer become one MatMul and a Split."""

from __future__ import annotations

import onnx_ir as ir

from passes.base import Pass, register_pass
from passes.parallel_matmul import fuse_group, parallel_groups


@register_pass
class FuseQKV(Pass):
    name = "fuse_qkv"
    description = "three MatMuls sharing an input (q/k/v) -> one MatMul + Split"

    def apply(self, model: ir.Model) -> int:
        groups = parallel_groups(model, fan_out=3)
        for i, nodes in enumerate(groups):
            fuse_group(model, nodes, f"fused_qkv.{i}")
        return len(groups)

    def why_not(self, model: ir.Model) -> str | None:
        return ("no activation feeds exactly three MatMuls with constant weights of one input size "
                "(graphs from trtbuild's own emitter already read a fused qkv weight)")
