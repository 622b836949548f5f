"""The gated MLP: down(act(gate) * up), gate and up from one fused [gate; up] matmul."""

from __future__ import annotations

import onnx_ir as ir

from engine_builder.config import ModelConfig
from engine_builder.network.builder import GraphBuilder
from engine_builder.network.linear import linear
from engine_builder.network.weights import CheckpointWeights


def gated_mlp(b: GraphBuilder, x: ir.Value, cfg: ModelConfig, w: CheckpointWeights, layer: int) -> ir.Value:
    """x: [batch, seq, hidden] (already normalized) -> [batch, seq, hidden]."""
    p = f"layers.{layer}.mlp."
    inter = cfg.intermediate_size
    with b.scope("mlp"):
        gate_up_bias = w[p + "gate_up.bias"] if cfg.mlp_bias else None
        gate_up = linear(b, w, x, p + "gate_up", gate_up_bias)  # [batch, seq, 2 inter]
        gate, up = b.op_multi("Split", gate_up, b.ints([inter, inter]), axis=-1, num_outputs=2)
        if cfg.activation == "silu":
            act = b.op("Mul", gate, b.op("Sigmoid", gate))  # x * sigmoid(x), as exporters write SiLU
        else:
            # gelu_pytorch_tanh; Gelu(approximate="tanh") is a standard op since opset 20
            act = b.op("Gelu", gate, approximate="tanh")
        hidden = b.op("Mul", act, up)  # [batch, seq, inter]
        return linear(b, w, hidden, p + "down", w[p + "down.bias"] if cfg.mlp_bias else None)
