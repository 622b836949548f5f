"""The model's norms (NormSpec.kind), as plain ops. RMSNorm in the exact order transformers computes it:

    Pow(x, 2) -> ReduceMean(-1) -> Add(eps) -> Sqrt -> Reciprocal -> Mul(x) -> Mul(weight)

always in float32 (activations in a 16-bit dtype are cast up and back), so one rewrite
pattern covers every architecture.
"""

from __future__ import annotations

import onnx_ir as ir

from engine_builder.formats.model_config import NormSpec
from engine_builder.network.builder import FLOAT, GraphBuilder


def norm(b: GraphBuilder, x: ir.Value, weight: ir.Value, spec: NormSpec, name: str = "norm") -> ir.Value:
    """x: [..., hidden] normalized over the last axis by the norm kind of SPEC."""
    return _NORMS[spec.kind](b, x, weight, spec.eps, spec.weight_offset, name=name)


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


# NormSpec.kind -> its emitter
_NORMS = {"rms_norm": rms_norm}
