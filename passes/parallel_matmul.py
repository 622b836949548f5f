"""Shared by fuse_qkv and fuse_gate_up: N MatMuls reading one activation become one MatMul + Split.

Grouping MatMuls by their shared input is a use-list lookup in onnx_ir, not pattern
matching: the onnxscript matcher handles multi-output patterns by trying every combination
of candidate nodes, which grows with the cube of the graph size for three projections.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_ir as ir

from passes.base import Pass


def _weight(node: ir.Node) -> np.ndarray | None:
    """The constant 2-D [in, out] weight of a MatMul, if it has one."""
    w = node.inputs[1]
    if w is None or w.const_value is None or len(w.const_value.shape) != 2:
        return None
    return w


def parallel_groups(model: ir.Model, fan_out: int) -> list[list[ir.Node]]:
    """Groups of exactly `fan_out` MatMuls that read the same value through input 0."""
    groups = []
    seen: set[int] = set()
    for node in model.graph:
        x = node.inputs[0] if node.op_type == "MatMul" and node.inputs else None
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        users = [u.node for u in x.uses() if u.node.op_type == "MatMul" and u.idx == 0 and u.node.domain == ""]
        weights = [_weight(n) for n in users]
        if len(users) != fan_out or any(w is None for w in weights):
            continue
        if len({w.const_value.shape[0] for w in weights}) == 1 and len({w.dtype for w in weights}) == 1:
            groups.append(users)
    return groups


def fuse_group(model: ir.Model, nodes: list[ir.Node], name: str) -> None:
    """Replace `nodes` (MatMul(x, W_i)) by Split(MatMul(x, concat_i W_i), axis=-1)."""
    graph = model.graph
    x = nodes[0].inputs[0]
    weights = [n.inputs[1] for n in nodes]
    widths = [w.const_value.shape[1] for w in weights]
    fused = np.concatenate([w.const_value.numpy() for w in weights], axis=1)  # [in, sum(out_i)]
    w_value = ir.Value(name=f"{name}.weight", shape=ir.Shape(fused.shape), type=ir.TensorType(weights[0].dtype),
                       const_value=ir.tensor(fused, name=f"{name}.weight"))
    graph.register_initializer(w_value)
    split_sizes = ir.Value(name=f"{name}.split", const_value=ir.tensor(np.array(widths, np.int64),
                                                                           name=f"{name}.split"))
    graph.register_initializer(split_sizes)
    matmul = ir.Node("", "MatMul", [x, w_value], name=f"{name}/MatMul")
    split = ir.Node("", "Split", [matmul.outputs[0], split_sizes], attributes=[ir.AttrInt64("axis", -1)],
                    num_outputs=len(nodes), name=f"{name}/Split")
    first = min(nodes, key=lambda n: list(graph).index(n))
    graph.insert_before(first, [matmul, split])
    for old, new in zip(nodes, split.outputs):
        new.shape, new.type, new.name = old.outputs[0].shape, old.outputs[0].type, old.outputs[0].name + ".fused"
        ir.convenience.replace_all_uses_with(old.outputs[0], new, replace_graph_outputs=True)
    graph.remove(nodes, safe=True)
    for w in weights:
        if not w.uses() and w.name in graph.initializers:
            del graph.initializers[w.name]


class ParallelMatMulPass(Pass):
    """Fuses every group of exactly `fan_out` MatMuls sharing an input; subclasses name the group."""

    fan_out: ClassVar[int]
    what: ClassVar[str]  # "qkv", "gate_up": names the fused weights and the why-not message

    def apply(self, model: ir.Model) -> int:
        groups = parallel_groups(model, self.fan_out)
        for i, nodes in enumerate(groups):
            fuse_group(model, nodes, f"fused_{self.what}.{i}")
        return len(groups)

    def why_not(self, model: ir.Model) -> str | None:
        return (f"no activation feeds exactly {self.fan_out} MatMuls with constant weights of one input size "
                f"(graphs from trtbuild's own emitter already read a fused {self.what} weight)")
