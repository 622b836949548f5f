"""The sparse mixture-of-experts MLP (MlpSpec kind "moe"), in ops both TensorRT and onnxruntime run.

    router    probs = Softmax(x @ router.T) in float32; top_k of them per token (TopK); divided by their
              sum when norm_topk (mixtral; qwen per norm_topk_prob), as transformers' *TopKRouter does
    experts   y = sum over the token's top_k experts e of weight_e * down_e(act(gate_e(x)) * up_e(x))
    shared    + sigmoid(shared_gate(x)) * down_s(act(gate_s(x)) * up_s(x))         (qwen2_moe)

The experts' work has two forms, picked per step by an If on the token count T (formats/moe_layout.py
has the stacked weights):

    gather (T * top_k < num_experts, decode)   Gather the routed experts' weights by top-k index and
                                               batch-multiply: [T, k, 2I, H] @ [T, k, H, 1]. Reads only
                                               the routed experts, so its cost follows top_k, not E.
    dense  (otherwise, prefill)                every expert on every token, [E, 2I, H] @ [H, T], the
                                               outputs weighted by the routing weights scattered into
                                               [E, T] (zero where not routed). Once T * top_k reaches E a
                                               gather would copy more weight rows than the dense form
                                               reads, and one batched GEMM beats E small ones.

Neither form transposes a weight: the stacks stay [E, out, in] as stored, so no [E, in, out] copy is
made by either backend. A data-dependent grouping (NonZero per expert, as transformers loops) would
make prefill proportional too, but TensorRT-RTX 1.7 has no NonZero without a plugin (measured:
"NonZero plugin creator version 1 was not found").
"""

from __future__ import annotations

import json
from collections.abc import Callable

import onnx_ir as ir

from engine_builder.formats.model_config import ModelConfig
from engine_builder.formats.quant_layout import weight_kind
from engine_builder.network.builder import FLOAT, GraphBuilder
from engine_builder.network.linear import linear
from engine_builder.network.weights import CheckpointWeights
from engine_builder.util.errors import UnsupportedError

Emit = Callable[[GraphBuilder, ir.Value], ir.Value]
# metadata key on each expert If: its operands by value name (passes/lower_ort_moe.py reads it)
MOE_METADATA = "trtbuild.moe"


def moe_mlp(b: GraphBuilder, x: ir.Value, cfg: ModelConfig, w: CheckpointWeights, p: str,
            activation: Emit) -> ir.Value:
    """x: [batch, seq, hidden] (normalized) -> [batch, seq, hidden]; P is "layers.{i}.mlp."."""
    h, spec = cfg.hidden_size, cfg.block.mlp
    flat = b.op("Reshape", x, b.ints([-1, h]))  # [T, hidden]
    with b.scope("router"):
        weights, chosen = _route(b, flat, w[p + "router.weight"], spec.top_k, spec.norm_topk)
    inter = cfg.intermediate_size
    gate_up = _stack(b, w, p + "experts.gate_up", spec.num_experts, h)  # [E, 2I, hidden]
    down = _stack(b, w, p + "experts.down", spec.num_experts, inter)  # [E, hidden, I]
    tokens = b.op("Gather", b.op("Shape", flat), b.ints([0]), axis=0)  # [1]
    # gather while it reads fewer expert rows than the dense form: T * top_k < E
    use_gather = b.op("Squeeze", b.op("Less", b.op("Mul", tokens, b.ints([spec.top_k])),
                                      b.ints([spec.num_experts])), b.ints([0]))
    routed = _if(b, use_gather,
                 lambda: _gathered_experts(b, flat, gate_up, down, weights, chosen, inter, activation),
                 lambda: _dense_experts(b, flat, gate_up, down, weights, chosen, inter, spec.num_experts, activation),
                 name="experts")
    routed.shape, routed.dtype = ir.Shape([None, h]), b.dtype
    # what passes/lower_ort_moe.py needs to replace the If by onnxruntime's per-expert form
    routed.producer().metadata_props[MOE_METADATA] = json.dumps({
        "experts": spec.num_experts, "top_k": spec.top_k, "inter": inter, "activation": spec.activation,
        "x": flat.name, "gate_up": gate_up.name, "down": down.name, "weights": weights.name, "chosen": chosen.name})
    if spec.shared_expert_size:
        with b.scope("shared"):
            routed = b.op("Add", routed, _shared_expert(b, flat, cfg, w, p, activation))
    return b.op("Reshape", routed, b.op("Shape", x))  # [batch, seq, hidden]


def _route(b: GraphBuilder, x: ir.Value, router: ir.Value, top_k: int, norm_topk: bool) -> tuple[ir.Value, ir.Value]:
    """x [T, hidden] -> (routing weights [T, k] in the compute dtype, expert indices [T, k] int64)."""
    logits = b.linear(x, router)  # [T, E]
    if b.dtype != FLOAT:  # transformers: softmax(router_logits, dtype=float)
        logits = b.cast(logits, FLOAT)
    probs = b.op("Softmax", logits, axis=-1)
    top, chosen = b.op_multi("TopK", probs, b.ints([top_k]), axis=-1, largest=1, sorted=1, num_outputs=2)
    if norm_topk:
        top = b.op("Div", top, b.op("ReduceSum", top, b.ints([-1]), keepdims=1))
    if b.dtype != FLOAT:
        top = b.cast(top, b.dtype)
    return top, chosen


def _stack(b: GraphBuilder, w: CheckpointWeights, prefix: str, experts: int, inputs: int) -> ir.Value:
    """The [E * out, in] expert stack of linear PREFIX as [E, out, in], in the compute dtype.

    A quantized stack (weight-only int8 per channel or blocked, int4 blocked: FORMAT.md's [out, in]
    layout, so each expert's rows keep their own scales) is dequantized whole, as linear() does."""
    q = w.quantization
    if prefix not in q.quantized:
        return b.op("Reshape", w[prefix + ".weight"], b.ints([experts, -1, inputs]))
    kind = weight_kind(q)
    if q.activation != "none" or kind == "fp8" or q.scheme == "gguf":
        raise UnsupportedError(f"{prefix}: MoE experts take weight-only int8/int4 quantization, not {q.scheme}; "
                               f"re-run `trtbuild convert --quant int8_wo` or int4_wo (or --exclude '*.experts.*')")
    weight, scale = w.stored(prefix + ".weight"), w[prefix + ".weight_scale"]
    if kind == "int8" and q.group_size is None:
        weight = b.op("DequantizeLinear", weight, scale, axis=0)  # scale [E * out]
    else:
        zero = w.stored(prefix + ".weight_zero") if q.zero_point else None
        weight = b.op("DequantizeLinear", weight, scale, zero, axis=1, block_size=q.group_size)
    return b.op("Reshape", weight, b.ints([experts, -1, inputs]))


def _gathered_experts(b: GraphBuilder, x: ir.Value, gate_up: ir.Value, down: ir.Value, weights: ir.Value,
                      chosen: ir.Value, inter: int, activation: Emit) -> ir.Value:
    """Only the routed experts' weights: [T, k, out, in] @ [T, k, in, 1] per projection."""
    w_gate_up = b.op("Gather", gate_up, chosen, axis=0)  # [T, k, 2I, hidden]
    column = b.op("Unsqueeze", x, b.ints([1, 3]))  # [T, 1, hidden, 1]
    gu = b.op("Squeeze", b.op("MatMul", w_gate_up, column), b.ints([-1]))  # [T, k, 2I]
    gate, up = b.op_multi("Split", gu, b.ints([inter, inter]), axis=-1, num_outputs=2)
    hidden = b.op("Unsqueeze", b.op("Mul", activation(b, gate), up), b.ints([-1]))  # [T, k, I, 1]
    w_down = b.op("Gather", down, chosen, axis=0)  # [T, k, hidden, I]
    out = b.op("Squeeze", b.op("MatMul", w_down, hidden), b.ints([-1]))  # [T, k, hidden]
    out = b.op("Mul", out, b.op("Unsqueeze", weights, b.ints([-1])))
    return b.op("ReduceSum", out, b.ints([1]), keepdims=0)  # [T, hidden]


def _dense_experts(b: GraphBuilder, x: ir.Value, gate_up: ir.Value, down: ir.Value, weights: ir.Value,
                   chosen: ir.Value, inter: int, experts: int, activation: Emit) -> ir.Value:
    """Every expert on every token, weighted by the routing weights (0 for experts not routed to)."""
    columns = b.op("Transpose", x, perm=[1, 0])  # [hidden, T]
    gu = b.op("MatMul", gate_up, columns)  # [E, 2I, T]
    gate, up = b.op_multi("Split", gu, b.ints([inter, inter]), axis=1, num_outputs=2)
    out = b.op("MatMul", down, b.op("Mul", activation(b, gate), up))  # [E, hidden, T]
    # [T, k] weights at their experts' columns of a zero [T, E], then [E, 1, T]
    zeros = b.op("Expand", b.const(0.0), b.op("Concat", b.op("Shape", weights, end=1), b.ints([experts]), axis=0))
    dense = b.op("ScatterElements", zeros, chosen, weights, axis=1)  # [T, E]
    dense = b.op("Unsqueeze", b.op("Transpose", dense, perm=[1, 0]), b.ints([1]))  # [E, 1, T]
    out = b.op("ReduceSum", b.op("Mul", out, dense), b.ints([0]), keepdims=0)  # [hidden, T]
    return b.op("Transpose", out, perm=[1, 0])  # [T, hidden]


def _shared_expert(b: GraphBuilder, x: ir.Value, cfg: ModelConfig, w: CheckpointWeights, p: str,
                   activation: Emit) -> ir.Value:
    """qwen2_moe's always-on expert: sigmoid(shared_gate(x)) * down(act(gate(x)) * up(x)), [T, hidden]."""
    size = cfg.block.mlp.shared_expert_size
    gate, up = b.op_multi("Split", linear(b, w, x, p + "shared.gate_up"), b.ints([size, size]), axis=-1,
                          num_outputs=2)
    out = linear(b, w, b.op("Mul", activation(b, gate), up), p + "shared.down")
    if cfg.block.mlp.shared_expert_gate:
        out = b.op("Mul", b.op("Sigmoid", b.linear(x, w[p + "shared_gate.weight"])), out)
    return out


def _if(b: GraphBuilder, cond: ir.Value, then: Callable[[], ir.Value], otherwise: Callable[[], ir.Value],
        name: str) -> ir.Value:
    """If(cond) with each branch's nodes emitted by a callable into its own subgraph.

    Every value a branch reads from outside (weights, routing) must exist before this call: a weight's
    first use may emit its Cast (CheckpointWeights), which must land in the main graph, not one branch."""
    branches = []
    for label, emit in (("then", then), ("else", otherwise)):
        saved, b.tape = b.tape, ir.tape.Tape()
        try:
            with b.scope(f"{name}.{label}"):
                out = emit()
            branches.append(ir.Graph(inputs=[], outputs=[out], nodes=b.tape.nodes, name=f"{name}_{label}"))
        finally:
            b.tape = saved
    return b.op("If", cond, name=name, then_branch=branches[0], else_branch=branches[1])

