"""Tensor parallel inside the torch decoder: this rank's share of a tp group and the three collectives it needs.

A tp=N engine dir holds one shard per rank (rank{r}.safetensors, converters/parallel_shard.py, by the rules of
formats/parallel_mapping.py): the decoder of rank r is the model of mapping.local_model(cfg) over its shard, and
these collectives make its partial results whole (Megatron's layout):

    embed      vocab-parallel: ids outside this rank's rows [r V/N, (r+1) V/N) embed as zeros, all-reduce
    o, down    row-parallel: the ranks' outputs are partial sums, all-reduce (no bias: the mapping refuses one)
    lm_head    vocab-parallel: each rank's [tokens, V/N] logits, all-gathered into [tokens, V]

They run on the device tensors themselves through torch.distributed (NCCL on cuda:LOCAL_RANK, gloo on the
CPU), no host copies, no host synchronization, so a CUDA graph captures them with the rest of a decode step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

# torch 2.13 names it all_gather_single and deprecates all_gather_into_tensor; the GPU image's torch 2.11 has the latter
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class TensorParallel:
    size: int  # tp
    rank: int  # this rank's place in the tp group (its shard)
    group: Any = None  # the torch.distributed group of the tp ranks (None: the default group)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of X over the tp ranks, in place (X contiguous)."""
        dist.all_reduce(x, group=self.group)
        return x

    def embed(self, token_ids: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
        """token_ids [T] (full vocabulary) over this rank's embedding rows shard [V/N, hidden] -> [T, hidden]: each
        id's row from the rank that holds it, zeros from the others, so the sum is exact."""
        rows = shard.shape[0]
        local = token_ids - self.rank * rows
        outside = (local < 0) | (local >= rows)
        h = F.embedding(local.clamp(0, rows - 1), shard).masked_fill_(outside[:, None], 0)  # [T, hidden]
        return self.all_reduce(h)

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, V/N] of every rank -> [N, V], ranks' columns in rank order."""
        n = logits.shape[0]
        # the concatenated form [tp * N, V/N] (gloo takes no other), read as [tp, N, V/N]
        parts = torch.empty((self.size * n, logits.shape[1]), dtype=logits.dtype, device=logits.device)
        _all_gather(parts, logits.contiguous(), group=self.group)
        return parts.view(self.size, n, -1).permute(1, 0, 2).reshape(n, -1)
