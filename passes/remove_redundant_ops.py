"""remove_redundant_ops: Identity nodes, no-op or back-to-back Casts, Reshape and Unsqueeze chains.

Rules that compare a constant operand with a literal (x * 1, x + 0) are left out on purpose:
onnxscript's matcher reads the whole constant to compare it, which for a weight means loading
it from rank0.safetensors (and onnx_ir refuses the hard-linked file we keep there).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.rules import common

from passes.base import RewritePass, register_pass
from passes.graph_stats import op_counts


@register_pass
class RemoveRedundantOps(RewritePass):
    name = "remove_redundant_ops"
    description = "drop Identity, no-op Cast/Expand/Transpose, collapse Cast→Cast and Reshape→Reshape"

    def rules(self) -> Sequence[pattern.RewriteRule]:
        return [common.no_op_cast_rule, common.cast_cast_rule, common.reshape_reshape_rule,
                common.no_op_expand_rule, common.no_op_transpose_rule, common.unsqueeze_unsqueeze_rule]

    def apply(self, model: ir.Model) -> int:
        rewrites = super().apply(model)
        identities = op_counts(model)["Identity"]
        ir.passes.common.IdentityEliminationPass()(model)
        return rewrites + identities - op_counts(model)["Identity"]
