"""eliminate_dead_code: drop nodes and initializers that no graph output depends on."""

from __future__ import annotations

import onnx_ir as ir

from passes.base import Pass, register_pass
from passes.graph_stats import num_nodes


@register_pass
class EliminateDeadCode(Pass):
    name = "eliminate_dead_code"
    description = "remove nodes and initializers no output depends on"

    def apply(self, model: ir.Model) -> int:
        before = num_nodes(model) + len(model.graph.initializers)
        ir.passes.common.RemoveUnusedNodesPass()(model)
        return before - num_nodes(model) - len(model.graph.initializers)

    def why_not(self, model: ir.Model) -> str | None:
        return "every node feeds a graph output"
