"""fold_constants: evaluate subgraphs whose inputs are all constant (shape arithmetic, rope tables).

Size limits keep it from materializing weight-sized tensors: weights stay external data in
rank0.safetensors and are never copied into model.onnx.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.optimizer import fold_constants as _fold

from passes.base import Pass, register_pass
from passes.graph_stats import num_nodes

# elements; a folded output larger than this (e.g. Transpose(weight)) stays a node
OUTPUT_LIMIT = 65536
INPUT_LIMIT = 65536


def _small_inputs_only(node: ir.Node) -> bool | None:
    """Never fold a node that reads a weight (external data) or a large constant: onnxscript
    exempts Transpose of an initializer from its size limits, which would copy the weight
    into model.onnx instead of leaving it in rank0.safetensors."""
    for value in node.inputs:
        const = value.const_value if value is not None else None
        if const is not None and (isinstance(const, ir.ExternalTensor) or const.size > INPUT_LIMIT):
            return False
    return None


@register_pass
class FoldConstants(Pass):
    name = "fold_constants"
    description = "evaluate small all-constant subgraphs"

    def apply(self, model: ir.Model) -> int:
        before = num_nodes(model)
        _fold(model, input_size_limit=INPUT_LIMIT, output_size_limit=OUTPUT_LIMIT, should_fold=_small_inputs_only)
        ir.passes.common.RemoveUnusedNodesPass()(model)
        return before - num_nodes(model)

    def why_not(self, model: ir.Model) -> str | None:
        return "no node has only constant inputs within the size limit"
