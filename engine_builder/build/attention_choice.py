"""Which onnxruntime attention lowering a build uses: without the per-layer If when max_batch is 1.

lower_ort_attention keeps an If per layer for the one step onnxruntime's CPU GroupQueryAttention refuses (a
multi-token step over a non-empty cache at batch > 1). An engine of max_batch 1 never runs such a step, so
its twin takes lower_ort_attention_single (GQA alone, the same numerics) in the same place of the pass list;
the manifest's pass list records the swap.
"""

from __future__ import annotations

import dataclasses

from engine_builder.formats.build_config import BuildConfig

BATCHED, SINGLE = "lower_ort_attention", "lower_ort_attention_single"


def with_attention_lowering(config: BuildConfig) -> BuildConfig:
    """CONFIG with passes.onnxruntime's lower_ort_attention swapped for lower_ort_attention_single when
    limits.max_batch is 1 (and back when it is not: a recipe's list built for another max_batch)."""
    wanted, other = (SINGLE, BATCHED) if config.limits.max_batch == 1 else (BATCHED, SINGLE)
    passes = config.passes.onnxruntime
    if other not in passes:
        return config
    swapped = tuple(wanted if p == other else p for p in passes)
    return dataclasses.replace(config, passes=dataclasses.replace(config.passes, onnxruntime=swapped))
