"""The tensors of an MoE MLP (MlpSpec kind "moe") in a checkpoint: the expert stacks and the router.

Each expert is a gated MLP like a dense one; the experts of a layer are stacked along dim 0 of one
2-D tensor per projection, expert-major, so every quantization scheme's [out, in] layout (per row
scales, per row blocks along `in`) applies to them unchanged, one expert's rows never sharing a
scale with another's:

    mlp.router.weight             [E, hidden]                 float, never quantized
    mlp.experts.gate_up.weight    [E * 2 inter, hidden]       expert e: rows [e*2I, e*2I+I) gate, then I up
    mlp.experts.down.weight       [E * hidden, inter]         expert e: rows [e*H, (e+1)*H)
    mlp.shared.gate_up.weight     [2 shared, hidden]          only with a shared expert
    mlp.shared.down.weight        [hidden, shared]
    mlp.shared_gate.weight        [1, hidden]                 only with shared_expert_gate; float
"""

from __future__ import annotations

from engine_builder.formats.model_config import ModelConfig

Shapes = dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]]

# the linears a scheme may quantize (checkpoint.linear_prefixes); the router and shared gate stay float
MOE_LINEARS = ("mlp.experts.gate_up", "mlp.experts.down", "mlp.shared.gate_up", "mlp.shared.down")


def moe_mlp_shapes(cfg: ModelConfig, p: str) -> Shapes:
    """Canonical name -> (shape, rows of each source part) for the MoE MLP under prefix P ("layers.0.mlp.")."""
    h, inter, spec = cfg.hidden_size, cfg.intermediate_size, cfg.block.mlp
    e = spec.num_experts
    shapes: Shapes = {
        p + "router.weight": ((e, h), None),
        p + "experts.gate_up.weight": ((e * 2 * inter, h), (inter, inter) * e),
        p + "experts.down.weight": ((e * h, inter), (h,) * e),
    }
    if spec.shared_expert_size:
        s = spec.shared_expert_size
        shapes[p + "shared.gate_up.weight"] = ((2 * s, h), (s, s))
        shapes[p + "shared.down.weight"] = ((h, s), None)
        if spec.shared_expert_gate:
            shapes[p + "shared_gate.weight"] = ((1, h), None)
    return shapes



def describe_moe(cfg: ModelConfig) -> str | None:
    """One line for `trtbuild inspect`: experts, routing, shared expert; None for a dense MLP."""
    spec = cfg.block.mlp
    if spec.kind != "moe":
        return None
    text = (f"{spec.num_experts} experts of width {cfg.intermediate_size}, {spec.activation}; router: softmax, "
            f"top-{spec.top_k}, {'renormalized to sum 1' if spec.norm_topk else 'not renormalized'}")
    if spec.shared_expert_size:
        gate = " under a sigmoid gate" if spec.shared_expert_gate else ""
        text += f"; shared expert of width {spec.shared_expert_size}{gate}"
    return text
