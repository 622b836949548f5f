"""TensorRT optimization profile of an encoder engine: one profile over dynamic batch and sequence.

An encoder sees whole texts in one call (no decode step), so the decoder's two profiles (decode seq 1,
prefill) collapse into one: batch 1..max_batch, tokens 1..max_input_len, optimized for a batch of
short sentences.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from engine_builder.formats.build_config import BuildConfig
from engine_builder.formats.model_config import ModelConfig

OPT_SEQ = 64  # a sentence or two: what embedding requests mostly hold


def encoder_profiles(config: BuildConfig, inputs: list[ir.Value]) -> tuple[dict, ...]:
    lim = config.limits
    shapes = ((1, 1), (lim.max_batch, min(OPT_SEQ, lim.max_input_len)), (lim.max_batch, lim.max_input_len))
    return ({value.name: shapes for value in inputs},)  # input_ids, attention_mask: [batch, seq]


def fit_encoder_limits(config: BuildConfig, model: ModelConfig) -> BuildConfig:
    """CONFIG with max_input_len and max_seq_len cut to the longest input MODEL takes (its position table, or
    sentence-transformers' max_seq_length): the decoder defaults (1024 / 2048) would let a profile outrun it."""
    assert model.encoder is not None
    top = model.encoder.max_tokens(model.max_position_embeddings)
    lim = config.limits
    if lim.max_input_len <= top and lim.max_seq_len <= top:
        return config
    # an encoder has no KV cache: max_seq_len only has to satisfy Limits.validate
    longest = min(lim.max_input_len, top)
    return dataclasses.replace(config, limits=dataclasses.replace(lim, max_input_len=longest, max_seq_len=longest))
