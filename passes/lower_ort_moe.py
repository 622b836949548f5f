"""lower_ort_moe: the portable MoE If (gathered experts | dense) -> onnxruntime's per-expert form.

    If(T * k < E, gather routed weights -> batched MatMul, all experts -> weighted sum)
 -> for e in 0..E-1:  tok = NonZero(any(chosen == e))          # the tokens routed to expert e
                      y_e = down_e(act(gate_e(x[tok])) * up_e(x[tok])) * weight_e[tok]
                      acc = acc + ScatterND(zeros, tok, y_e)

Each expert multiplies only the rows routed to it, so a step costs what its routed experts cost, at
decode and at prefill, and experts are added in index order as transformers' index_add_ loop does.
The portable form's gather copies the routed experts' weights every step before multiplying them
(measured, tiny Mixtral in benchmarks/moe_decode.py: that copy is half of its decode time); here each
expert's weight is a constant slice that onnxruntime folds and pre-packs once at session creation.
TensorRT-RTX 1.7 cannot take this form (NonZero needs a plugin the wheel lacks), so it is onnxruntime only.

Only float expert stacks are lowered: a quantized stack would be dequantized whole every step by the
per-expert slices, so quantized experts keep the portable form.
"""

from __future__ import annotations

import json

import numpy as np
import onnx_ir as ir

from engine_builder.network.moe import MOE_METADATA
from passes.base import Pass, register_pass

_FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


@register_pass
class LowerOrtMoe(Pass):
    name = "lower_ort_moe"
    description = "MoE experts as one NonZero-gathered GEMM pair per expert (onnxruntime)"

    def apply(self, model: ir.Model) -> int:
        graph, count = model.graph, 0
        values = _values_by_name(graph)
        for node in list(graph):
            spec = self._spec(node, values)
            if spec is None:
                continue
            nodes, out = _per_expert(graph, node.name, spec, {k: values[spec[k]] for k in _OPERANDS})
            graph.insert_before(node, nodes)
            ir.convenience.replace_all_uses_with(node.outputs[0], out)
            out.shape, out.type = node.outputs[0].shape, node.outputs[0].type
            graph.remove(node, safe=True)
            count += 1
        return count

    def why_not(self, model: ir.Model) -> str | None:
        values = _values_by_name(model.graph)
        for node in model.graph:
            if node.op_type == "If" and MOE_METADATA in node.metadata_props:
                return _why(node, json.loads(node.metadata_props[MOE_METADATA]), values)
        return "no MoE If (network/moe.py) in the graph"

    @staticmethod
    def _spec(node: ir.Node, values: dict[str, ir.Value]) -> dict | None:
        if node.op_type != "If" or MOE_METADATA not in node.metadata_props:
            return None
        spec = json.loads(node.metadata_props[MOE_METADATA])
        return None if _why(node, spec, values) else spec


_OPERANDS = ("x", "gate_up", "down", "weights", "chosen")


def _why(node: ir.Node, spec: dict, values: dict[str, ir.Value]) -> str | None:
    missing = [k for k in _OPERANDS if spec.get(k) not in values]
    if missing:
        return f"{node.name}: operand(s) {', '.join(missing)} no longer in the graph"
    for key in ("gate_up", "down"):
        if not _float_stack(values[spec[key]]):
            return f"{node.name}: the {key} expert stack is not a float initializer (quantized experts stay portable)"
    if spec.get("activation") not in _ACTIVATIONS:
        return f"{node.name}: activation {spec.get('activation')!r} unknown to this pass"
    return None


def _float_stack(value: ir.Value) -> bool:
    """Reshape(W) or Reshape(Cast(W)) of a float initializer: folded per expert by onnxruntime."""
    node = value.producer()
    if node is None or node.op_type != "Reshape":
        return False
    source = node.inputs[0]
    if source.producer() is not None and source.producer().op_type == "Cast":
        source = source.producer().inputs[0]
    return source.is_initializer() and source.dtype in _FLOATS


def _values_by_name(graph: ir.Graph) -> dict[str, ir.Value]:
    values = {v.name: v for v in graph.initializers.values()}
    values.update({v.name: v for v in graph.inputs})
    values.update({out.name: out for node in graph for out in node.outputs})
    return values


class _Emitter:
    """Nodes for the graph, named under the If they replace; small int64 constants as initializers."""

    def __init__(self, graph: ir.Graph, prefix: str):
        self.graph, self.prefix, self.nodes, self.n = graph, prefix, [], 0

    def op(self, op_type: str, *inputs: ir.Value, **attrs) -> ir.Value:
        self.n += 1
        name = f"{self.prefix}/{op_type}_{self.n}"
        node = ir.node(op_type, list(inputs), attributes=attrs, name=name)
        node.outputs[0].name = name
        self.nodes.append(node)
        return node.outputs[0]

    def split(self, x: ir.Value, sizes: list[int]) -> tuple[ir.Value, ...]:
        self.n += 1
        name = f"{self.prefix}/Split_{self.n}"
        node = ir.node("Split", [x, self.ints(sizes)], attributes={"axis": -1}, num_outputs=len(sizes), name=name)
        for i, out in enumerate(node.outputs):
            out.name = f"{name}:{i}"
        self.nodes.append(node)
        return tuple(node.outputs)

    def const(self, array: np.ndarray) -> ir.Value:
        self.n += 1
        value = ir.Value(name=f"{self.prefix}/const_{self.n}", shape=ir.Shape(array.shape),
                         type=ir.TensorType(ir.DataType.from_numpy(array.dtype)), const_value=ir.tensor(array))
        self.graph.register_initializer(value)
        return value

    def ints(self, values: list[int] | int) -> ir.Value:
        return self.const(np.asarray(values, np.int64))


_ACTIVATIONS = {
    "silu": lambda e, x: e.op("Mul", x, e.op("Sigmoid", x)),
    "gelu_tanh": lambda e, x: e.op("Gelu", x, approximate="tanh"),
}


def _per_expert(graph: ir.Graph, prefix: str, spec: dict, v: dict[str, ir.Value]) -> tuple[list[ir.Node], ir.Value]:
    e = _Emitter(graph, prefix + ".ort")
    x, chosen, weights = v["x"], v["chosen"], v["weights"]  # [T, hidden], [T, k] int64, [T, k]
    inter, act = spec["inter"], _ACTIVATIONS[spec["activation"]]
    zero = e.op("CastLike", e.const(np.zeros((), np.float32)), x)
    acc = zeros = e.op("Expand", zero, e.op("Shape", x))  # [T, hidden]
    for expert in range(spec["experts"]):
        hit = e.op("Equal", chosen, e.ints(expert))  # [T, k]
        routed = e.op("ReduceMax", e.op("Cast", hit, to=ir.DataType.INT64), e.ints([1]), keepdims=0)  # [T]
        tokens = e.op("Reshape", e.op("NonZero", routed), e.ints([-1]))  # [n]
        weight = e.op("ReduceSum", e.op("Where", hit, weights, zero), e.ints([1]), keepdims=0)  # [T]
        rows = e.op("Gather", x, tokens, axis=0)  # [n, hidden]
        # constant per-expert slices [in, out]: folded and pre-packed by onnxruntime at session creation
        gate_up = e.op("Transpose", e.op("Gather", v["gate_up"], e.ints(expert), axis=0), perm=[1, 0])
        down = e.op("Transpose", e.op("Gather", v["down"], e.ints(expert), axis=0), perm=[1, 0])
        gate, up = e.split(e.op("MatMul", rows, gate_up), [inter, inter])  # [n, I] each
        out = e.op("MatMul", e.op("Mul", act(e, gate), up), down)  # [n, hidden]
        out = e.op("Mul", out, e.op("Unsqueeze", e.op("Gather", weight, tokens, axis=0), e.ints([-1])))
        # a token meets each expert at most once: scatter into zeros, then add (onnxruntime's CPU ScatterND
        # has no float16 reduction="add"); the adds run in expert order, in the compute dtype, as index_add_
        acc = e.op("Add", acc, e.op("ScatterND", zeros, e.op("Unsqueeze", tokens, e.ints([-1])), out))
    return e.nodes, acc
