"""The decoder's building blocks in torch, each in the exact order transformers computes it.

    norms        RMSNorm (llama: normalize in float32, back to the model dtype, times w; gemma: times (1 + w)
                 in float32, then back), LayerNorm with its bias (gpt2, gpt-neox): NormSpec.kind
    activations  silu, gelu (erf), gelu_tanh: MlpSpec.activation
    dense MLPs   gated down(act(gate) * up) from one fused [gate; up] linear, plain down(act(up)): MlpSpec.kind
    linear       F.linear; on a CPU in float32 through numpy's BLAS
    residual_add x + h, in the model dtype, as a pointwise add inductor fuses into the next norm

The graph emitter's twins are engine_builder/network/norms.py and mlp.py; they dispatch on the same spec.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine_builder.formats.model_config import MlpSpec, NormSpec

Activation = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class NormWeights:
    weight: torch.Tensor  # [size] model dtype, as stored (gemma's offset is applied at run time, as transformers does)
    bias: torch.Tensor | None = None  # [size], layer_norm only


def residual_add(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """x + h in the model dtype. Under torch.compile a 16-bit sum is written as float32 adds rounded once: the same
    bits (torch adds 16-bit tensors in float32 and rounds), but no longer inductor's add(mm(..), x) pattern, which it
    turns into addmm: on CUDA a copy of x into the output, then a gemm that reads it back (beta 1), 60 of SmolLM2's
    480 launches a decode step, where a pointwise add fuses into the norm that reads the sum next."""
    if torch.compiler.is_compiling() and x.dtype in (torch.float16, torch.bfloat16):
        return (x.float() + h.float()).to(x.dtype)
    return x + h


def norm(x: torch.Tensor, w: NormWeights, spec: NormSpec) -> torch.Tensor:
    """x [..., size] normalized over its last axis by SPEC's kind; the result in x's dtype."""
    if spec.kind == "layer_norm":
        weight = w.weight + spec.weight_offset if spec.weight_offset else w.weight
        # torch takes the statistics of a 16-bit input in float32 itself
        return F.layer_norm(x, (x.shape[-1],), weight, w.bias, spec.eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + spec.eps)
    if spec.weight_offset:
        # gemma: (x_normed * (offset + w)) in float32, then back to the activation dtype
        return (h * (spec.weight_offset + w.weight.float())).to(x.dtype)
    # llama: back to the activation dtype first, then times the weight
    return w.weight * h.to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear (weight [out, in]). A float32 product on a CPU goes through numpy's matmul, which is OpenBLAS in
    numpy's wheels: torch's CPU wheel multiplies with MKL, which on the AMD EPYC of CI streamed SmolLM2's decode
    weights at 10-16 GB/s where OpenBLAS streamed 13-29 (micro-benchmarks of the [in, out] layout; end to end,
    with the reference attention's change, decode 14.9 -> 21.9 tok/s, the weights column-major then and the same
    as stored: benchmarks/results/cpu-torch-backend-2026-12-05b.txt). The arrays share the tensors' memory. Under
    torch.compile (which would trace numpy into torch ops anyway) and elsewhere, F.linear."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or torch.compiler.is_compiling():
        return F.linear(x, weight, bias)
    # a strided input would take numpy's loop, not BLAS; the weight is BLAS's either way ([in, out] C or F order)
    y = torch.from_numpy(np.matmul(x.contiguous().numpy(), weight.numpy().T))
    return y if bias is None else y + bias


ACTIVATIONS: dict[str, Activation] = {
    "silu": F.silu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # gelu_pytorch_tanh, gelu_new
    "gelu": F.gelu,  # transformers' "gelu": the exact erf form
}


@dataclass(frozen=True)
class DenseMlpWeights:
    """gated: `up` is the fused [gate; up] weight [2 inter, hidden]; plain: up [inter, hidden]."""

    up: torch.Tensor
    down: torch.Tensor  # [hidden, inter]
    up_bias: torch.Tensor | None = None
    down_bias: torch.Tensor | None = None


def gated_mlp(x: torch.Tensor, w: DenseMlpWeights, act: Activation) -> torch.Tensor:
    """x [T, hidden] -> [T, hidden]: down(act(gate(x)) * up(x))."""
    gate, up = linear(x, w.up, w.up_bias).chunk(2, dim=-1)  # [T, inter] each
    return linear(act(gate) * up, w.down, w.down_bias)


def plain_mlp(x: torch.Tensor, w: DenseMlpWeights, act: Activation) -> torch.Tensor:
    """x [T, hidden] -> [T, hidden]: down(act(up(x)))."""
    return linear(act(linear(x, w.up, w.up_bias)), w.down, w.down_bias)


DENSE_MLPS: dict[str, Callable[[torch.Tensor, DenseMlpWeights, Activation], torch.Tensor]] = {
    "gated": gated_mlp, "plain": plain_mlp}


def dense_mlp(x: torch.Tensor, w: DenseMlpWeights, spec: MlpSpec) -> torch.Tensor:
    return DENSE_MLPS[spec.kind](x, w, ACTIVATIONS[spec.activation])
