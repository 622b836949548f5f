"""The model's norms (NormSpec.kind), as plain ops. RMSNorm in the exact order transformers computes it:

    Pow(x, 2) -> ReduceMean(-1) -> Add(eps) -> Sqrt -> Reciprocal -> Mul(x) -> Mul(weight)

always in float32 (activations in a 16-bit dtype are cast up and back), so one rewrite
pattern covers every architecture. LayerNorm (gpt2, gpt-neox) is the standard
LayerNormalization-17 op with its bias, statistics in float32 (stash_type 1) as torch
computes them for 16-bit inputs; onnxruntime and TensorRT both have it as one kernel.
"""

from __future__ import annotations

import onnx_ir as ir

from engine_builder.formats.model_config import NormSpec
from engine_builder.network.builder import FLOAT, GraphBuilder
from engine_builder.network.weights import CheckpointWeights


def norm(b: GraphBuilder, x: ir.Value, weight: ir.Value, spec: NormSpec, name: str = "norm",
         bias: ir.Value | None = None) -> ir.Value:
    """x: [..., hidden] normalized over the last axis by the norm kind of SPEC (BIAS: layer_norm's)."""
    return _NORMS[spec.kind](b, x, weight, bias, spec, name)


def checkpoint_norm(b: GraphBuilder, x: ir.Value, w: CheckpointWeights, tensor: str, spec: NormSpec,
                    name: str) -> ir.Value:
    """Norm TENSOR of the checkpoint ("layers.0.attn_norm"): its weight, and its bias when the spec has one."""
    return norm(b, x, w[tensor + ".weight"], spec, name, w[tensor + ".bias"] if spec.bias else None)


def rms_norm(b: GraphBuilder, x: ir.Value, weight: ir.Value, eps: float, offset: float = 0.0,
             name: str = "norm") -> ir.Value:
    """Normalize over the last axis. offset=1 is gemma's (1 + w) weight."""
    upcast = b.dtype != FLOAT
    with b.scope(name):
        h = b.cast(x, FLOAT) if upcast else x
        mean_square = b.op("ReduceMean", b.op("Pow", h, b.const(2.0, FLOAT)), b.ints([-1]), keepdims=1)
        inv_rms = b.op("Reciprocal", b.op("Sqrt", b.op("Add", mean_square, b.const(eps, FLOAT))))
        h = b.op("Mul", h, inv_rms)
        if offset:
            # gemma: (x_normed * (1 + w)) in float32, then back to the activation dtype
            w = b.cast(weight, FLOAT) if upcast else weight
            h = b.op("Mul", h, b.op("Add", b.const(offset, FLOAT), w))
            return b.cast(h, b.dtype) if upcast else h
        # llama: back to the activation dtype first, then times the weight
        if upcast:
            h = b.cast(h, b.dtype)
        return b.op("Mul", h, weight)


def layer_norm(b: GraphBuilder, x: ir.Value, weight: ir.Value, bias: ir.Value | None, eps: float,
               offset: float = 0.0, name: str = "norm") -> ir.Value:
    """(x - mean) / sqrt(var + eps) * weight (+ bias) over the last axis, in the activation dtype."""
    with b.scope(name):
        if offset:
            weight = b.op("Add", b.const(offset), weight)
        return b.op("LayerNormalization", x, weight, bias, axis=-1, epsilon=eps, stash_type=1)


# NormSpec.kind -> its emitter
_NORMS = {
    "rms_norm": lambda b, x, weight, bias, spec, name: rms_norm(b, x, weight, spec.eps, spec.weight_offset, name),
    "layer_norm": lambda b, x, weight, bias, spec, name: layer_norm(b, x, weight, bias, spec.eps,
                                                                    spec.weight_offset, name),
}
