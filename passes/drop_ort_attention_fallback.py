"""drop_ort_attention_fallback: lower_ort_attention's If(GQA, fallback) becomes its GroupQueryAttention alone.

lower_ort_attention wraps each layer's GroupQueryAttention in an If whose else branch (TensorScatter +
Attention-24) serves the one step onnxruntime's CPU GQA refuses: several rows, several tokens, over a
non-empty cache. In a decode step the If costs its own dispatch and subgraph frame (0.45-0.63 ms per
SmolLM2 step of 30 layers, onnxruntime profile on a quiet Xeon, 1 and 2 threads), and the values only the
fallback reads (the additive mask, the rotary tables, the branch condition: ~20 small nodes) are computed
every step, since a main-graph node runs whichever branch is taken. Here the If goes, and those nodes with
it; the graph's metadata `trtbuild.gqa_rows_per_call` = 1 tells the runner (runner/ort_backend.py) to run
such a step one row per call, which GQA accepts: the same attention per row, the same cache writes.

Only the single-process onnxruntime twin runs this (DEFAULT_PASSES); tp/pp segment twins are not lowered.
"""

from __future__ import annotations

import onnx_ir as ir

from engine_builder.formats import graph_io as io
from passes.base import MS_DOMAIN, Pass, register_pass

FALLBACK_PREFIX = "ort_attention."  # the names lower_ort_attention gives its nodes


def _gqa_branch(node: ir.Node) -> ir.Node | None:
    """The GroupQueryAttention an If of lower_ort_attention runs in its then branch, else None."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx") or not node.name.startswith(FALLBACK_PREFIX):
        return None
    then = node.attributes.get("then_branch")
    nodes = list(then.value) if then is not None else []
    if len(nodes) != 1 or nodes[0].op_type != "GroupQueryAttention" or nodes[0].domain != MS_DOMAIN:
        return None
    if list(then.value.outputs) != list(nodes[0].outputs):
        return None
    return nodes[0]


@register_pass
class DropOrtAttentionFallback(Pass):
    name = "drop_ort_attention_fallback"
    description = "If(GroupQueryAttention, fallback) -> GroupQueryAttention; the runner splits the steps GQA refuses"

    def apply(self, model: ir.Model) -> int:
        graph, count = model.graph, 0
        for node in list(graph):
            gqa = _gqa_branch(node)
            if gqa is None:
                continue
            alone = ir.Node(gqa.domain, gqa.op_type, list(gqa.inputs), attributes=list(gqa.attributes.values()),
                            num_outputs=len(gqa.outputs), name=gqa.name)
            graph.insert_before(node, alone)
            for old, new in zip(node.outputs, alone.outputs):
                name, old.name = old.name, f"{old.name}.if"
                new.name, new.shape, new.type = name, old.shape, old.type
                ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
            for attr in ("then_branch", "else_branch"):  # their nodes' reads of main-graph values would keep
                for inner in ir.traversal.RecursiveGraphIterator(node.attributes[attr].value):  # those alive
                    for i in range(len(inner.inputs)):
                        inner.replace_input_with(i, None)
            graph.remove(node, safe=True)
            count += 1
        if count:
            ir.passes.common.RemoveUnusedNodesPass()(model)
            model.metadata_props[io.META_GQA_ROWS_PER_CALL] = "1"
        return count

    def why_not(self, model: ir.Model) -> str | None:
        return "no If of lower_ort_attention (run lower_ort_attention first)"
