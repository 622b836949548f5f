"""lower_ort_attention_single: lower_ort_attention without the If, for a graph whose steps hold one sequence.

lower_ort_attention wraps each layer's GroupQueryAttention in an If (seq == 1 or batch == 1 or no past ->
GQA, else the Attention-24 fallback) because onnxruntime's CPU GQA refuses a multi-token step over a
non-empty cache at batch > 1. An engine built with max_batch 1 never has such a step: its KV buffers hold
one row, so the If always takes GQA, and this pass emits GQA alone (same numerics, same shared-buffer
in-place update). `trtbuild build` picks it instead of lower_ort_attention for max_batch 1 (build/
attention_choice.py): a speculative draft, which steps one request at a time, is such an engine. Measured
on a SmolLM2-135M int4 draft step (2 threads): the If cost ~16 us per layer beside its GQA, ~5-10 % of that
step (README, "An int4 draft that pays").
"""

from __future__ import annotations

from passes.base import register_pass
from passes.lower_ort_attention import LowerOrtAttention


@register_pass
class LowerOrtAttentionSingle(LowerOrtAttention):
    name = "lower_ort_attention_single"
    description = "attention block -> com.microsoft GroupQueryAttention alone (no If): graphs of one sequence a step"
    single = True
