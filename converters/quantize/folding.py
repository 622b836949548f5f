"""Folding per-input-channel scales (AWQ, SmoothQuant) into the op before each linear.

A linear y = W x with a scale s per input channel computes the same y as (W diag(s)) (x / s).
W diag(s) is what gets quantized; x / s must come from the op that produces x, so 1/s is
folded into it (FORMAT.md):

    qkv      <- attn_norm     (RMSNorm weight; gemma's (offset + w) norms through block.norm.weight_offset;
                               a LayerNorm's bias too)
    gate_up  <- mlp_norm      (up of a plain MLP likewise)
    down     <- the `up` rows of gate_up (down's input is act(gate) * up, linear in up); a plain
                MLP's down reads act(up), which no scale passes through: not folded
    o        <- the v rows of qkv, only when num_heads == num_kv_heads: with grouped-query
                attention one v row feeds several heads, i.e. several o input channels

A linear with no such producer (o under GQA, lm_head) keeps s = 1.
"""

from __future__ import annotations

import numpy as np

from engine_builder.formats.model_config import ModelConfig

# MlpSpec.kind -> the MLP linear that reads mlp_norm's output
_MLP_INPUT = {"gated": "gate_up", "plain": "up"}


def norm_before(model: ModelConfig) -> dict[str, str]:
    """Linear prefix -> the norm weight that produces its input."""
    folds = {}
    for i in range(model.num_layers):
        folds[f"layers.{i}.attn.qkv"] = f"layers.{i}.attn_norm.weight"
        if (mlp_input := _MLP_INPUT.get(model.block.mlp.kind)) is not None:  # moe: calibrated schemes refused
            folds[f"layers.{i}.mlp.{mlp_input}"] = f"layers.{i}.mlp_norm.weight"
    return folds


def rows_before(model: ModelConfig) -> dict[str, tuple[str, slice]]:
    """Linear prefix -> (linear prefix, its output rows) that produce its input."""
    inter, q, kv = model.intermediate_size, model.q_dim, model.kv_dim
    folds = {}
    for i in range(model.num_layers):
        if model.block.mlp.kind == "gated":
            folds[f"layers.{i}.mlp.down"] = (f"layers.{i}.mlp.gate_up", slice(inter, 2 * inter))
        if model.num_heads == model.num_kv_heads:
            folds[f"layers.{i}.attn.o"] = (f"layers.{i}.attn.qkv", slice(q + kv, q + 2 * kv))
    return folds


def foldable(model: ModelConfig) -> set[str]:
    """Linear prefixes whose input scale can be folded away."""
    return set(norm_before(model)) | set(rows_before(model))


# the order scales are searched in: a linear's rows are scaled by its consumer's 1/s before its
# own search, so the consumers (o, down) come before the producers (qkv, gate_up)
SEARCH_ORDER = ("attn.o", "mlp.down", "attn.qkv", "mlp.gate_up", "mlp.up")


class Folding:
    """Rewrites checkpoint tensors for per-input-channel scales: prefix -> s [in] (absent: 1)."""

    def __init__(self, model: ModelConfig, scales: dict[str, np.ndarray]):
        unfoldable = sorted(set(scales) - foldable(model))
        if unfoldable:
            raise ValueError(f"no op to fold the input scales of {', '.join(unfoldable)} into")
        self.scales = scales
        self._offset = model.block.norm.weight_offset
        self._norms = {norm: prefix for prefix, norm in norm_before(model).items() if prefix in scales}
        # a LayerNorm's bias is part of its output: it is divided by the same s
        self._norm_biases = {norm.removesuffix(".weight") + ".bias": prefix for norm, prefix in self._norms.items()
                             if model.block.norm.bias}
        # producer prefix -> (rows, consumer's s)
        self._rows = {producer: (rows, scales[consumer])
                      for consumer, (producer, rows) in rows_before(model).items() if consumer in scales}

    def touches(self, name: str) -> bool:
        prefix = name.rsplit(".", 1)[0]
        return (name in self._norms or name in self._norm_biases or prefix in self._rows
                or (name.endswith(".weight") and prefix in self.scales))

    def apply(self, name: str, tensor: np.ndarray) -> np.ndarray:
        """`tensor` (float32, as stored under `name`) with the scales folded in; a new array."""
        t = np.array(tensor, np.float32)
        if name in self._norms:  # [hidden]: the norm's effective multiplier (offset + w) becomes (offset + w) / s
            return (self._offset + t) / self.scales[self._norms[name]] - self._offset
        if name in self._norm_biases:  # [hidden]
            return t / self.scales[self._norm_biases[name]]
        prefix, kind = name.rsplit(".", 1)
        if prefix in self._rows:  # weight [out, in] or bias [out]: these rows' outputs become x / s
            rows, s = self._rows[prefix]
            t[rows] /= s.reshape((-1,) + (1,) * (t.ndim - 1))
        if kind == "weight" and prefix in self.scales:  # [out, in]: W diag(s)
            t *= self.scales[prefix][None, :]
        return t
