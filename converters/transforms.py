"""Re-layouts of a source tensor on its way to the canonical layout, declared per architecture.

Most architectures store their weights the way the checkpoint does ([out, in] rows, fused parts
concatenated along dim 0), so their tensors are copied byte for byte. A few do not:

    Transposed       GPT-2's Conv1D stores x @ W with W [in, out]; canonical is [out, in]
    HeadsInterleaved GPT-NeoX's query_key_value rows are per head [q_h; k_h; v_h] for h in heads;
                     canonical is [q_0..q_H; k_0..k_H; v_0..v_H] (fuse_qkv's and the attention's split)

A converter names them in its `transforms` (HF tensor template -> transform). A transformed tensor
is loaded whole (one tensor in memory), re-laid out and cast; the plan checks shapes after `shape()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from engine_builder.formats.model_config import ModelConfig

if TYPE_CHECKING:
    import torch


class Transform(Protocol):
    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The canonical shape of a source tensor of SHAPE."""
        ...

    def apply(self, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        """The source tensor in the canonical layout (a new, contiguous tensor)."""
        ...


@dataclass(frozen=True)
class Transposed:
    """A 2-D weight stored [in, out] (transformers' Conv1D) -> [out, in]."""

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(reversed(shape))

    def apply(self, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        return tensor.t().contiguous()


@dataclass(frozen=True)
class HeadsInterleaved:
    """Fused q/k/v rows (weight [3 * heads * head_dim, in] or bias [3 * heads * head_dim]) stored head by
    head, each head's q, k, v rows together -> all q rows, then all k, then all v."""

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        return shape

    def apply(self, tensor: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
        rest = tuple(tensor.shape[1:])
        per_head = tensor.reshape(cfg.num_heads, 3, cfg.head_dim, *rest)  # [heads, q|k|v, head_dim, ...]
        return per_head.transpose(0, 1).reshape(3 * cfg.num_heads * cfg.head_dim, *rest).contiguous()
