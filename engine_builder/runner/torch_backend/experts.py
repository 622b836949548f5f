"""The sparse mixture-of-experts MLP (MlpSpec kind "moe") in torch, with no host synchronization.

    router   probs = softmax(x @ router.T) in float32, top_k per token, renormalized to sum 1 when norm_topk,
             then in the model dtype (transformers' *TopKRouter)
    experts  y = sum over the token's top_k experts e of weight_e * down_e(act(gate_e(x)) * up_e(x))
    shared   + sigmoid(shared_gate(x)) * down_s(act(gate_s(x)) * up_s(x))              (qwen2_moe)

transformers groups tokens by expert with nonzero(), a host sync a CUDA graph cannot hold, so the experts'
work takes one of two sync-free forms, chosen by the token count (a shape, fixed per captured graph), as
engine_builder/network/moe.py chooses them:

    gather (T * top_k < num_experts, decode)   the routed experts' weights gathered by index and batch-multiplied:
                                               reads only the routed experts
    dense  (otherwise, prefill)                every expert on every token, one expert at a time (memory stays
                                               one expert's activations), weighted by the routing weight scattered
                                               to [T, E] (0 where not routed); summed in expert order, as
                                               transformers' index_add over the experts it hit
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_builder.formats.model_config import MlpSpec
from engine_builder.runner.torch_backend.layers import ACTIVATIONS, Activation, linear


@dataclass(frozen=True)
class MoeWeights:
    router: torch.Tensor  # [E, hidden]
    gate_up: torch.Tensor  # [E, 2 inter, hidden]: expert e's gate rows, then its up rows
    down: torch.Tensor  # [E, hidden, inter]
    shared_gate_up: torch.Tensor | None = None  # [2 shared, hidden]
    shared_down: torch.Tensor | None = None  # [hidden, shared]
    shared_gate: torch.Tensor | None = None  # [1, hidden]


def moe_mlp(x: torch.Tensor, w: MoeWeights, spec: MlpSpec) -> torch.Tensor:
    """x [T, hidden] (normalized) -> [T, hidden]."""
    act = ACTIVATIONS[spec.activation]
    weights, chosen = _route(x, w.router, spec.top_k, spec.norm_topk)  # [T, k] model dtype, [T, k] int64
    if x.shape[0] * spec.top_k < spec.num_experts:
        out = _gathered(x, w, weights, chosen, act)
    else:
        out = _dense(x, w, weights, chosen, act)
    if w.shared_gate_up is not None and w.shared_down is not None:
        gate, up = linear(x, w.shared_gate_up).chunk(2, dim=-1)
        shared = linear(act(gate) * up, w.shared_down)
        if w.shared_gate is not None:
            shared = torch.sigmoid(linear(x, w.shared_gate)) * shared
        out = out + shared
    return out


def _route(x: torch.Tensor, router: torch.Tensor, top_k: int, norm_topk: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(linear(x, router).float(), dim=-1)  # [T, E] float32
    top, chosen = torch.topk(probs, top_k, dim=-1)
    if norm_topk:
        top = top / top.sum(dim=-1, keepdim=True)
    return top.to(x.dtype), chosen


def _gathered(x: torch.Tensor, w: MoeWeights, weights: torch.Tensor, chosen: torch.Tensor,
              act: Activation) -> torch.Tensor:
    gate_up = w.gate_up[chosen]  # [T, k, 2I, hidden]
    gate, up = (gate_up @ x[:, None, :, None]).squeeze(-1).chunk(2, dim=-1)  # [T, k, I] each
    out = (w.down[chosen] @ (act(gate) * up)[..., None]).squeeze(-1)  # [T, k, hidden]
    return (out * weights[..., None]).sum(dim=1)  # [T, hidden]


def _dense(x: torch.Tensor, w: MoeWeights, weights: torch.Tensor, chosen: torch.Tensor,
           act: Activation) -> torch.Tensor:
    experts = w.gate_up.shape[0]
    dense = torch.zeros(x.shape[0], experts, dtype=weights.dtype, device=x.device).scatter_(1, chosen, weights)
    out = torch.zeros_like(x)  # [T, hidden]
    for e in range(experts):
        gate, up = linear(x, w.gate_up[e]).chunk(2, dim=-1)  # [T, I] each
        out = out + linear(act(gate) * up, w.down[e]) * dense[:, e:e + 1]
    return out
