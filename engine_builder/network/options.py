"""Build options of the decoder graph."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine_builder.formats.build_config import check_kv_layout, check_limit
from engine_builder.util.errors import ConfigError

ComputeDtype = Literal["auto", "float32", "float16", "bfloat16"]


@dataclass(frozen=True)
class NetworkOptions:
    # KV slots per sequence; static so TensorRT can size the cache buffers at build time
    max_seq_len: int = 2048
    # logits for every position ([batch, seq, vocab]) instead of the last one ([batch, 1, vocab])
    all_logits: bool = False
    # without all_logits: logits for the last min(seq, logits_tail) positions. 1 = the last only; more lets
    # a speculative verify step (the last token plus k drafts) read every position's logits in one pass
    logits_tail: int = 1
    # activation dtype; "auto" computes in the checkpoint's dtype, anything else casts the weights
    dtype: ComputeDtype = "auto"
    # slots: past_key.{i} [batch, kv_heads, max_seq, head_dim] per sequence; paged: a block pool read
    # through a block table (formats/graph_io.py, network/paged_attention.py)
    kv_layout: str = "slots"
    kv_block_size: int = 16

    def validate(self) -> None:
        check_limit("max_seq_len", self.max_seq_len)
        check_limit("logits_tail", self.logits_tail)
        if self.dtype not in ("auto", "float32", "float16", "bfloat16"):
            raise ConfigError(f"dtype {self.dtype!r} is not one of auto, float32, float16, bfloat16")
        check_kv_layout(self.kv_layout, self.kv_block_size)
