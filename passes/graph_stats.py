"""Op counts of an onnx_ir model: what pass reports and pass tests compare."""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir


def op_counts(model: ir.Model) -> Counter[str]:
    """op_type (prefixed with its domain when not ONNX's) -> number of nodes, subgraphs included."""
    counts: Counter[str] = Counter()
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        counts[f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type] += 1
    return counts


def num_nodes(model: ir.Model) -> int:
    return sum(op_counts(model).values())
