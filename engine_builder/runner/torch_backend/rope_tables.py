"""Rotary cos/sin tables on the device, made once per model, and the rotate-half apply.

The inverse frequencies are formats/rope_frequencies.py's, the ones the graph emitter uses (bit-identical to
transformers'). A table row is cos/sin(position * inv_freq) computed in float32 and times the attention factor,
then cast to the model dtype: what transformers' rotary embedding returns for that position, so a forward only
indexes rows by position. Two rope types depend on the sequence length, decided per sequence from its length
once the step's tokens are written (the graph's max(position_ids) + 1):

    longrope  a second (long) table, taken once the sequence is longer than long_after (phi3); its cached keys
              were rotated with the short one, so the backend re-prefills at the switch (reprefill_after)
    dynamic   past max_position_embeddings the base grows with the length: computed per token at run time
              (transformers recomputes it every step); below it, the static table
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine_builder.formats.model_config import LayerType, ModelConfig
from engine_builder.formats.rope_frequencies import DynamicNtk, RopeFrequencies, rope_frequencies


@dataclass(frozen=True, eq=False)
class RotaryTable:
    dim: int  # rotary channels per head (partial rotary when < head_dim)
    interleaved: bool  # GPT-J pairs (2i, 2i + 1) instead of halves
    cos: torch.Tensor  # [max_positions, dim] model dtype; longrope: the short table
    sin: torch.Tensor
    long_cos: torch.Tensor | None = None  # longrope: [max_positions, dim], used past long_after
    long_sin: torch.Tensor | None = None
    long_after: int | None = None
    dynamic: DynamicNtk | None = None
    inv_freq: torch.Tensor | None = None  # dynamic: [dim / 2] float32, the static frequencies
    exponents: torch.Tensor | None = None  # dynamic: [dim / 2] float32, arange(0, dim, 2) / dim

    def cos_sin(self, positions: torch.Tensor, seq_lens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T] int64, seq_lens [T] int64 (each token's sequence length; needed by longrope and
        dynamic only) -> cos, sin [T, 1, dim] in the model dtype, broadcasting over heads."""
        if self.dynamic is not None:
            assert seq_lens is not None
            cos, sin = self._dynamic(positions, seq_lens)
        elif self.long_cos is not None:
            assert seq_lens is not None and self.long_sin is not None
            use_long = (seq_lens > self.long_after)[:, None]  # [T, 1]
            cos = torch.where(use_long, self.long_cos[positions], self.cos[positions])
            sin = torch.where(use_long, self.long_sin[positions], self.sin[positions])
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        return cos[:, None, :], sin[:, None, :]

    def _dynamic(self, positions: torch.Tensor, seq_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers' _compute_dynamic_ntk_parameters with a per-token length, in float32."""
        d, dim = self.dynamic, self.dim
        assert d is not None and self.inv_freq is not None and self.exponents is not None
        length = seq_lens[:, None]  # [T, 1] int64, promoted to float32 as transformers' seq_len is
        base = d.theta * ((d.factor * length / d.max_position_embeddings) - (d.factor - 1)) ** (dim / (dim - 2))
        grown = 1.0 / (base ** self.exponents)  # [T, dim / 2]
        # up to max_position_embeddings transformers keeps its init-time table
        inv_freq = torch.where(length > d.max_position_embeddings, grown, self.inv_freq)
        emb = _channels(positions.float()[:, None] * inv_freq, self.interleaved)  # [T, dim]
        return emb.cos().to(self.cos.dtype), emb.sin().to(self.cos.dtype)


def rotary_tables(cfg: ModelConfig, max_positions: int, device: torch.device | str,
                  dtype: torch.dtype) -> dict[LayerType, RotaryTable]:
    """One table per layer type, shared where the frequencies are (only gemma3's local layers differ)."""
    by_local: dict[bool, RotaryTable] = {}
    tables: dict[LayerType, RotaryTable] = {}
    for layer_type in dict.fromkeys(cfg.block.attention.layer_types):
        local = layer_type == "sliding_attention" and cfg.rope.local_theta is not None
        if local not in by_local:
            by_local[local] = _table(rope_frequencies(cfg, layer_type), cfg.rope.interleaved, max_positions,
                                     device, dtype)
        tables[layer_type] = by_local[local]
    return tables


def _table(f: RopeFrequencies, interleaved: bool, max_positions: int, device: torch.device | str,
           dtype: torch.dtype) -> RotaryTable:
    positions = torch.arange(max_positions, dtype=torch.float32, device=device)[:, None]  # [P, 1]

    def cos_sin(inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        emb = _channels(positions * inv_freq.to(device), interleaved)  # [P, dim] float32
        return (emb.cos() * f.attention_factor).to(dtype), (emb.sin() * f.attention_factor).to(dtype)

    inv_freq = torch.from_numpy(f.inv_freq)
    cos, sin = cos_sin(inv_freq)
    if f.long_inv_freq is not None:
        long_cos, long_sin = cos_sin(torch.from_numpy(f.long_inv_freq))
        return RotaryTable(f.dim, interleaved, cos, sin, long_cos, long_sin, f.long_after)
    if f.dynamic is not None:
        exponents = torch.arange(0, f.dim, 2, dtype=torch.int64).to(dtype=torch.float32) / f.dim
        return RotaryTable(f.dim, interleaved, cos, sin, dynamic=f.dynamic, inv_freq=inv_freq.to(device),
                           exponents=exponents.to(device))
    return RotaryTable(f.dim, interleaved, cos, sin)


def _channels(freqs: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """[..., dim / 2] angles -> [..., dim]: halves [f0..fn, f0..fn], or pairs [f0, f0, f1, f1, ...]."""
    if interleaved:
        return freqs.repeat_interleave(2, dim=-1)
    return torch.cat((freqs, freqs), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [T, heads, head_dim] -> same, its first cos.shape[-1] channels rotated (transformers' apply_rotary_pos_emb;
    cos, sin as RotaryTable.cos_sin gives them); INTERLEAVED: the table's GPT-J pairs."""
    dim = cos.shape[-1]
    x_rot, x_pass = x[..., :dim], x[..., dim:]
    if interleaved:  # GPT-J: (x0, x1) -> (-x1, x0) per channel pair
        pairs = x_rot.unflatten(-1, (dim // 2, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    else:  # rotate_half: cat(-x2, x1)
        rotated = torch.cat((-x_rot[..., dim // 2:], x_rot[..., :dim // 2]), dim=-1)
    out = x_rot * cos + rotated * sin
    return torch.cat((out, x_pass), dim=-1) if dim < x.shape[-1] else out
