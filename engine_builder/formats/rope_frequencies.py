"""Rotary inverse frequencies and attention factors, computed exactly as transformers does.

Each function mirrors one in transformers' `modeling_rope_utils` (5.x) operation for
operation in float32 torch, so the tables are bit-identical to the reference and any
logits difference points at the graph, not at the tables. The frequencies of `longrope`
and `dynamic` depend on the sequence length; for those we return what the graph needs
to make the same choice at run time (network/rotary.py). A contract of formats/ because both
halves read it: the graph emitter and the torch runtime (runner/torch_backend/rope_tables.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from engine_builder.formats.model_config import LayerType, ModelConfig, RopeScaling
from engine_builder.util.errors import UnsupportedError


@dataclass(frozen=True)
class DynamicNtk:
    """Dynamic NTK: for a sequence of length L > max_position_embeddings the base grows to
    theta * (factor * L / max_pos - (factor - 1)) ** (dim / (dim - 2))."""

    theta: float
    factor: float
    max_position_embeddings: int


@dataclass(frozen=True, eq=False)
class RopeFrequencies:
    dim: int  # rotary channels per head
    # [dim / 2] float32; for longrope the short table, for dynamic the table up to max_pos
    inv_freq: np.ndarray
    # multiplies cos and sin (yarn, longrope)
    attention_factor: float = 1.0
    # longrope: the table used once a sequence is longer than long_after positions
    long_inv_freq: np.ndarray | None = None
    long_after: int | None = None
    dynamic: DynamicNtk | None = None


def rope_frequencies(cfg: ModelConfig, layer_type: LayerType) -> RopeFrequencies:
    rope = cfg.rope
    dim = rope.dim
    if layer_type == "sliding_attention" and rope.local_theta is not None:
        # gemma3's local layers: their own base and never any scaling
        return RopeFrequencies(dim, _np(_default(rope.local_theta, dim)))
    s, theta = rope.scaling, rope.theta
    original = s.original_max_position_embeddings or cfg.max_position_embeddings
    if s.type == "default":
        return RopeFrequencies(dim, _np(_default(theta, dim)))
    if s.type == "linear":
        inv_freq = _default_int(theta, dim)
        inv_freq /= s.factor
        return RopeFrequencies(dim, _np(inv_freq))
    if s.type == "llama3":
        return RopeFrequencies(dim, _np(_llama3(theta, dim, s, original)))
    if s.type == "yarn":
        inv_freq, attention_factor = _yarn(theta, dim, s, original)
        return RopeFrequencies(dim, _np(inv_freq), attention_factor)
    if s.type == "longrope":
        return _longrope(theta, dim, s, original, cfg.max_position_embeddings)
    if s.type == "dynamic":
        # below max_position_embeddings transformers keeps the table computed at init, which is
        # the plain one (the formula gives exactly theta there)
        return RopeFrequencies(dim, _np(_default_int(theta, dim)),
                               dynamic=DynamicNtk(theta, s.factor, cfg.max_position_embeddings))
    raise UnsupportedError(f"rope scaling {s.type!r} is not supported")


def _np(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float32).numpy().copy()


def _default(base: float, dim: int) -> torch.Tensor:
    # compute_default_rope_parameters: float arange
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))


def _default_int(base: float, dim: int) -> torch.Tensor:
    # the scaled variants build the same table from an int64 arange
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def _llama3(base: float, dim: int, s: RopeScaling, old_context_len: int) -> torch.Tensor:
    inv_freq = _default_int(base, dim)
    factor, low_freq_factor, high_freq_factor = s.factor, s.low_freq_factor, s.high_freq_factor
    if low_freq_factor is None or high_freq_factor is None:
        raise UnsupportedError("llama3 rope scaling needs low_freq_factor and high_freq_factor")
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def _yarn(base: float, dim: int, s: RopeScaling, original: int) -> tuple[torch.Tensor, float]:
    factor = s.factor

    def get_mscale(scale: float, mscale: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = s.attention_factor
    if attention_factor is None:
        if s.mscale and s.mscale_all_dim:
            attention_factor = float(get_mscale(factor, s.mscale) / get_mscale(factor, s.mscale_all_dim))
        else:
            attention_factor = get_mscale(factor)
    beta_fast = s.beta_fast or 32
    beta_slow = s.beta_slow or 1

    def find_correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = find_correction_dim(beta_fast), find_correction_dim(beta_slow)
    if s.truncate is None or s.truncate:  # transformers defaults truncate to True
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers: prevent singularity
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)

    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = (inv_freq_interpolation * (1 - extrapolation_factor)
                + inv_freq_extrapolation * extrapolation_factor)
    return inv_freq, float(attention_factor)


def _longrope(base: float, dim: int, s: RopeScaling, original: int, max_pos: int) -> RopeFrequencies:
    if s.short_factor is None or s.long_factor is None:
        raise UnsupportedError("longrope scaling needs short_factor and long_factor")
    if len(s.short_factor) != dim // 2 or len(s.long_factor) != dim // 2:
        raise UnsupportedError(f"longrope factors must have rotary_dim / 2 = {dim // 2} entries")
    factor = s.factor if s.factor is not None else max_pos / original
    attention_factor = s.attention_factor
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    inv_freq_shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim

    def table(ext: tuple[float, ...]) -> np.ndarray:
        return _np(1.0 / (torch.tensor(ext, dtype=torch.float32) * base ** inv_freq_shape))

    return RopeFrequencies(dim, table(s.short_factor), float(attention_factor),
                           long_inv_freq=table(s.long_factor), long_after=original)
