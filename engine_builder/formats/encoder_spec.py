"""Encoder models (BERT family): what the encoder graph computes, its tensors and its I/O contract.

An encoder checkpoint is a ModelConfig whose `encoder` is set. Its layers are post-norm (BERT):

    x = LayerNorm(word[ids] + position[t + position_offset] + token_type[0])
    per layer:  x = LayerNorm(x + o(attention(x)));  x = LayerNorm(x + down(act(up(x))))
    pooled = pool(x, attention_mask)  [-> L2 normalize]            (sentence-transformers modules)

No KV cache and no rotary: the decoder's BlockSpec and rope fields are unused. The graph:

    input_ids       int64 [batch, seq]   right-padded token ids
    attention_mask  int64 [batch, seq]   1 = real token, 0 = padding
    ->
    embeddings      float32 [batch, hidden]   the pooled (and, with normalize, unit-length) vectors
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from engine_builder.util.errors import ConfigError

PoolingMode = Literal["mean", "cls", "max", "mean_sqrt_len", "lasttoken"]
EncoderActivation = Literal["gelu", "gelu_tanh", "relu"]

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
EMBEDDINGS = "embeddings"


@dataclass(frozen=True)
class PoolingSpec:
    """sentence-transformers' Pooling (1_Pooling/config.json) and Normalize modules."""

    mode: PoolingMode = "cls"
    normalize: bool = False
    # sentence-transformers truncates inputs to this many tokens (sentence_bert_config.json); None = the model's
    max_seq_length: int | None = None


@dataclass(frozen=True)
class EncoderSpec:
    type_vocab_size: int = 2
    pad_token_id: int = 0
    # RoBERTa numbers positions from padding_idx + 1; BERT from 0
    position_offset: int = 0
    layer_norm_eps: float = 1e-12
    activation: EncoderActivation = "gelu"
    pooling: PoolingSpec = field(default_factory=PoolingSpec)

    def validate(self, max_position_embeddings: int) -> None:
        if self.type_vocab_size < 1:
            raise ConfigError(f"model config: encoder.type_vocab_size must be >= 1, got {self.type_vocab_size}")
        if not math.isfinite(self.layer_norm_eps) or self.layer_norm_eps <= 0:
            raise ConfigError(f"model config: encoder.layer_norm_eps must be positive, got {self.layer_norm_eps}")
        if not 0 <= self.position_offset < max_position_embeddings:
            raise ConfigError(f"model config: encoder.position_offset {self.position_offset} must be in "
                              f"[0, max_position_embeddings {max_position_embeddings})")
        for name, value, kinds in (("pooling.mode", self.pooling.mode, PoolingMode),
                                   ("activation", self.activation, EncoderActivation)):
            if value not in get_args(kinds):
                raise ConfigError(f"model config: encoder.{name} {value!r} is not one of {', '.join(get_args(kinds))}")
        if self.pooling.max_seq_length is not None and self.pooling.max_seq_length < 1:
            raise ConfigError(f"model config: encoder.pooling.max_seq_length must be >= 1, got "
                              f"{self.pooling.max_seq_length}")

    def max_tokens(self, max_position_embeddings: int) -> int:
        """The longest input the model takes: its position table, or sentence-transformers' truncation."""
        room = max_position_embeddings - self.position_offset
        return min(room, self.pooling.max_seq_length) if self.pooling.max_seq_length else room


Shapes = dict[str, tuple[tuple[int, ...], tuple[int, ...] | None]]


def encoder_shapes(vocab: int, hidden: int, inter: int, layers: int, max_pos: int, spec: EncoderSpec) -> Shapes:
    """Canonical name -> (shape, rows of each fused part or None), in file order."""
    shapes: Shapes = {
        "embed.weight": ((vocab, hidden), None),
        "embed.position.weight": ((max_pos, hidden), None),
        "embed.token_type.weight": ((spec.type_vocab_size, hidden), None),
        "embed.norm.weight": ((hidden,), None),
        "embed.norm.bias": ((hidden,), None),
    }
    for i in range(layers):
        p = f"layers.{i}."
        shapes |= {
            p + "attn.qkv.weight": ((3 * hidden, hidden), (hidden, hidden, hidden)),
            p + "attn.qkv.bias": ((3 * hidden,), (hidden, hidden, hidden)),
            p + "attn.o.weight": ((hidden, hidden), None),
            p + "attn.o.bias": ((hidden,), None),
            p + "attn_norm.weight": ((hidden,), None),  # post-attention LayerNorm
            p + "attn_norm.bias": ((hidden,), None),
            p + "mlp.up.weight": ((inter, hidden), None),
            p + "mlp.up.bias": ((inter,), None),
            p + "mlp.down.weight": ((hidden, inter), None),
            p + "mlp.down.bias": ((hidden,), None),
            p + "mlp_norm.weight": ((hidden,), None),  # post-MLP LayerNorm
            p + "mlp_norm.bias": ((hidden,), None),
        }
    return shapes


def encoder_linears(layers: int) -> tuple[str, ...]:
    """Every linear a quantization scheme may quantize (no lm_head: an encoder has none)."""
    return tuple(f"layers.{i}.{p}" for i in range(layers) for p in ("attn.qkv", "attn.o", "mlp.up", "mlp.down"))
