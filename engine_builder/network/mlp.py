"""The MLP of a decoder layer (MlpSpec.kind).

    gated   down(act(gate) * up), gate and up from one fused [gate; up] matmul
    plain   down(act(up))  (gpt2, gpt-neox)
    moe     top-k routed gated experts (+ a shared expert), moe.py
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from engine_builder.formats.model_config import ModelConfig
from engine_builder.network.builder import GraphBuilder
from engine_builder.network.linear import linear
from engine_builder.network.moe import moe_mlp
from engine_builder.network.weights import CheckpointWeights

Emit = Callable[[GraphBuilder, ir.Value], ir.Value]


def mlp(b: GraphBuilder, x: ir.Value, cfg: ModelConfig, w: CheckpointWeights, layer: int) -> ir.Value:
    """x: [batch, seq, hidden] (already normalized) -> [batch, seq, hidden], by the block's MLP kind."""
    with b.scope("mlp"):
        return _MLPS[cfg.block.mlp.kind](b, x, cfg, w, f"layers.{layer}.mlp.")


def gated_mlp(b: GraphBuilder, x: ir.Value, cfg: ModelConfig, w: CheckpointWeights, p: str) -> ir.Value:
    inter, spec = cfg.intermediate_size, cfg.block.mlp
    gate_up = linear(b, w, x, p + "gate_up", w[p + "gate_up.bias"] if spec.bias else None)  # [batch, seq, 2 inter]
    gate, up = b.op_multi("Split", gate_up, b.ints([inter, inter]), axis=-1, num_outputs=2)
    hidden = b.op("Mul", _ACTIVATIONS[spec.activation](b, gate), up)  # [batch, seq, inter]
    return linear(b, w, hidden, p + "down", w[p + "down.bias"] if spec.bias else None)


def plain_mlp(b: GraphBuilder, x: ir.Value, cfg: ModelConfig, w: CheckpointWeights, p: str) -> ir.Value:
    spec = cfg.block.mlp
    up = linear(b, w, x, p + "up", w[p + "up.bias"] if spec.bias else None)  # [batch, seq, inter]
    return linear(b, w, _ACTIVATIONS[spec.activation](b, up), p + "down", w[p + "down.bias"] if spec.bias else None)


# MlpSpec.activation -> its ops
_ACTIVATIONS: dict[str, Emit] = {
    # x * sigmoid(x), as exporters write SiLU
    "silu": lambda b, x: b.op("Mul", x, b.op("Sigmoid", x)),
    # gelu_pytorch_tanh; Gelu(approximate="tanh") is a standard op since opset 20
    "gelu_tanh": lambda b, x: b.op("Gelu", x, approximate="tanh"),
    # transformers' "gelu": the exact erf form
    "gelu": lambda b, x: b.op("Gelu", x),
}
# MlpSpec.kind -> its emitter
_MLPS = {"gated": gated_mlp, "plain": plain_mlp,
         "moe": lambda b, x, cfg, w, p: moe_mlp(b, x, cfg, w, p, _ACTIVATIONS[cfg.block.mlp.activation])}
