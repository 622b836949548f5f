"""The model's layers through torch.compile: the elementwise work between the matmuls fused by inductor.

A small model's decode step replayed from a CUDA graph is still ~30 kernels a layer (norms, rotary, residuals,
activations one op at a time: SmolLM2-135M ran 2.7 ms a step at batch 1 on the H200, kernel-bound, not
bandwidth-bound). torch.compile fuses them. What is compiled is one decoder layer and the logits head, not the
whole forward: every layer runs the same code over its own weights (inputs of the compiled graph, not
constants), so one compile serves all of them; compiling the whole forward traced all 30 of SmolLM2's layers and
took over 100 s on the H200 (2026-12-02). The rotary of q and k, the paged KV write and the attention kernel go
in as one custom op (`trtbuild::kv_attention`; on CUDA two Triton launches, rotary_kv_write_triton.py and
paged_attention_triton.py) inductor does not trace into: the pools are mutated in place (declared, so nothing
copies them) and the Triton kernel's launch stays ours, sized by the step's max_query_len at each call (the op
runs as Python, also under a CUDA graph's capture). The token dimension is dynamic, so one compile serves every
CUDA-graph bucket and every prefill length (one token is specialized once more).

The write stays inside the op. Traced (0e983b2), inductor kept it in place on a CPU but on CUDA copied every
layer's whole pool each step: SmolLM2's decode step took 22 ms at batch 1 and at batch 64 on an H100 (12 GB of
pools), against 3.0 ms eager and 1.36 ms with the write inside the op
(benchmarks/results/gpu-decode-smollm2-h100-2026-12-05-traced-write.txt).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

# what the op runs, by device type, set from the model: the Triton kernels on CUDA (runtime.py), the references on a CPU
_ATTENTION: dict[str, Callable[..., torch.Tensor]] = {}
_KV_WRITE: dict[str, Callable[..., torch.Tensor]] = {}


@torch.library.custom_op("trtbuild::kv_attention", mutates_args=("k_pool", "v_pool"))
def kv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor | None,
                 sin: torch.Tensor | None, interleaved: bool, q_norm: torch.Tensor | None,
                 k_norm: torch.Tensor | None, norm_eps: float, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 slots: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                 query_start: torch.Tensor, scale: float, softcap: float | None,
                 sliding_window: int | None) -> torch.Tensor:
    """The model's kv_write (q/k norms, rotary of q and k, the pool write), then each sequence's queries attending to
    its pool blocks: [T, heads, head_dim]."""
    q = _KV_WRITE[q.device.type](q, k, v, cos, sin, k_pool, v_pool, slots, interleaved=interleaved, q_norm=q_norm,
                                 k_norm=k_norm, norm_eps=norm_eps)
    return _ATTENTION[q.device.type](q, k_pool, v_pool, block_tables, context_lens, query_start, scale=scale,
                                     softcap=softcap, sliding_window=sliding_window)  # a new tensor: no alias


@kv_attention.register_fake
def _(q, k, v, cos, sin, interleaved, q_norm, k_norm, norm_eps, k_pool, v_pool, slots, block_tables, context_lens,
      query_start, scale, softcap, sliding_window):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


class CompiledForward:
    """The model with its layers and head compiled (its attention goes through kv_attention from now on); called as
    the model is. `seconds`: the time of the calls that compiled (the warm-up, reported)."""

    def __init__(self, model) -> None:
        _ATTENTION[model.device.type] = model.attention
        _KV_WRITE[model.device.type] = model.kv_write
        # a shallow copy (the same weight tensors) whose layer and head are compiled: the model itself stays eager
        # for the steps that take no compiled path (an image prefill)
        self.model = copy.copy(model)
        self.model.kv_attention = kv_attention
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
