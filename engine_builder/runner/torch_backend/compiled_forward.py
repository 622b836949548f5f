"""The model's layers through torch.compile: the elementwise work between the matmuls fused by inductor.

A small model's decode step replayed from a CUDA graph is still ~30 kernels a layer (norms, rotary, residuals,
activations one op at a time: SmolLM2-135M ran 2.7 ms a step at batch 1 on the H200, kernel-bound, not
bandwidth-bound). torch.compile fuses them. What is compiled is one decoder layer and the logits head, not the
whole forward: every layer runs the same code over its own weights (inputs of the compiled graph, not
constants), so one compile serves all of them; compiling the whole forward traced all 30 of SmolLM2's layers and
took over 100 s on the H200 (2026-12-02). The paged KV write (write_kv's index_copy_ into the pools, graph
inputs) is traced: inductor writes the pools in place and fuses the write into the kernel that computes the
rotated keys. The attention kernel goes in as a custom op (`trtbuild::paged_attention`) it does not trace into:
the Triton kernel's launch stays ours, sized by the step's max_query_len at each call (the op runs as Python,
also under a CUDA graph's capture). The token dimension is dynamic, so one compile serves every
CUDA-graph bucket and every prefill length (one token is specialized once more).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

# the attention the op runs, by device type: the Triton kernel on CUDA, set by the runtime; the reference on a CPU
_ATTENTION: dict[str, Callable[..., torch.Tensor]] = {}


@torch.library.custom_op("trtbuild::paged_attention", mutates_args=())
def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                    context_lens: torch.Tensor, query_start: torch.Tensor, scale: float, softcap: float | None,
                    sliding_window: int | None) -> torch.Tensor:
    """Each sequence's queries attending to its pool blocks: [T, heads, head_dim] (a new tensor: no alias)."""
    return _ATTENTION[q.device.type](q, k_pool, v_pool, block_tables, context_lens, query_start, scale=scale,
                                     softcap=softcap, sliding_window=sliding_window)


@paged_attention.register_fake
def _(q, k_pool, v_pool, block_tables, context_lens, query_start, scale, softcap, sliding_window):
    return torch.empty_like(q)


def _attention_op(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_tables: torch.Tensor,
                  context_lens: torch.Tensor, query_start: torch.Tensor, *, scale: float, softcap: float | None = None,
                  sliding_window: int | None = None, image_ids: torch.Tensor | None = None) -> torch.Tensor:
    """The op with the model's attention signature (model.py AttentionFn); an image prefill never comes here."""
    assert image_ids is None, "an image prefill runs the eager model"
    return paged_attention(q, k_pool, v_pool, block_tables, context_lens, query_start, scale, softcap, sliding_window)


class CompiledForward:
    """The model with its layers and head compiled (its attention through the paged_attention op); called as
    the model is. `seconds`: the time of the calls that compiled (the warm-up, reported)."""

    def __init__(self, model, attention: Callable[..., torch.Tensor]) -> None:
        _ATTENTION[model.device.type] = attention
        # a shallow copy (the same weight tensors) whose layer and head are compiled: the model itself stays eager
        # for the steps that take no compiled path (an image prefill)
        self.model = copy.copy(model)
        self.model.attention = _attention_op
        self.model.decoder_layer = torch.compile(self.model._decoder_layer, dynamic=True, fullgraph=True)
        self.model.logits = torch.compile(self.model._logits, dynamic=True, fullgraph=True)
        self.seconds = 0.0
        self._seen: set[int] = set()

    def __call__(self, token_ids: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        first = min(token_ids.shape[0], 2) not in self._seen  # dynamo specializes 1, then one graph for the rest
        started = time.perf_counter()
        out = self.model(token_ids, *args, **kwargs)
        if first:
            self._seen.add(min(token_ids.shape[0], 2))
            self.seconds += time.perf_counter() - started
        return out
