"""The model's step through torch.compile: the elementwise work between the matmuls fused by inductor.

A small model's decode step replayed from a CUDA graph is still ~30 kernels a layer (norms, rotary, residuals,
activations one op at a time: SmolLM2-135M ran 2.7 ms a step at batch 1 on the H200, kernel-bound, not
bandwidth-bound). torch.compile fuses them; the paged KV write and the attention kernel go in as one custom op
(`trtbuild::kv_attention`) it does not trace into: the pools are mutated in place (declared, so nothing copies
them) and the Triton kernel's launch stays ours, sized by the step's max_query_len at each call (the op runs
as Python, also under a CUDA graph's capture). The token dimension is dynamic, so one compile serves every
CUDA-graph bucket and every prefill length (one token is specialized once more): eager prefill of a small model
is bound by launching its kernels one by one, as eager decode is.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from engine_builder.runner.torch_backend.device_kv_attention import write_kv

# the attention the op runs, by device type: the Triton kernel on CUDA, set by the runtime; the reference on a CPU
_ATTENTION: dict[str, Callable[..., torch.Tensor]] = {}


@torch.library.custom_op("trtbuild::kv_attention", mutates_args=("k_pool", "v_pool"))
def kv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 slots: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                 query_start: torch.Tensor, scale: float, softcap: float | None,
                 sliding_window: int | None) -> torch.Tensor:
    """write_kv, then each sequence's queries attending to its pool blocks: [T, heads, head_dim]."""
    write_kv(k_pool, v_pool, slots, k, v)
    return _ATTENTION[q.device.type](q, k_pool, v_pool, block_tables, context_lens, query_start, scale=scale,
                                     softcap=softcap, sliding_window=sliding_window)  # a new tensor: no alias


@kv_attention.register_fake
def _(q, k, v, k_pool, v_pool, slots, block_tables, context_lens, query_start, scale, softcap, sliding_window):
    return torch.empty_like(q)


class CompiledForward:
    """model.forward compiled (the model's attention goes through kv_attention from now on); `seconds` is the
    time of the calls that compiled (the warm-up, reported)."""

    def __init__(self, model, attention: Callable[..., torch.Tensor]) -> None:
        _ATTENTION[model.device.type] = attention
        model.kv_attention = kv_attention
        self._compiled = torch.compile(model.forward, dynamic=True, fullgraph=True)
        self.seconds = 0.0
        self._seen: set[int] = set()

    def __call__(self, token_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        first = min(token_ids.shape[0], 2) not in self._seen  # dynamo specializes 1, then one graph for the rest
        started = time.perf_counter()
        out = self._compiled(token_ids, *args, **kwargs)
        if first:
            self._seen.add(min(token_ids.shape[0], 2))
            self.seconds += time.perf_counter() - started
        return out
