"""What the torch backend holds on one GPU, before anything loads (`trtbuild plan` and `inspect` show it).

The runtime's own accounting (runner/torch_backend/device.py, vLLM's convention): the process may use
utilization x the device's memory; the weights (the checkpoint's tensors in the engine's dtype, quantized ones
dequantized at load) and a reserve for the largest step's activations and the CUDA graphs' pool come first, and the
paged KV pool takes the rest, in whole blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine_builder.formats.build_config import Limits
from engine_builder.formats.checkpoint import expected_shapes
from engine_builder.formats.graph_io import KV_ITEM_BYTES, PagedKVLayout
from engine_builder.formats.model_config import ModelConfig
from engine_builder.util.errors import InputError

GIB = 1 << 30


def check_utilization(utilization: float) -> None:
    if not 0 < utilization <= 1:
        raise InputError(f"gpu_memory_utilization (--gpu-memory-utilization) must be in (0, 1], got {utilization}")


@dataclass(frozen=True)
class DevicePlan:
    device_bytes: int  # the GPU's memory
    utilization: float  # the share of it the process may use (--gpu-memory-utilization)
    dtype: str  # the weights' and the KV's dtype on the device
    weights: int  # bytes
    reserve: int  # bytes kept for activations and CUDA graphs
    kv_bytes_per_block: int
    block_size: int
    max_seq_len: int

    @property
    def kv_pool(self) -> int:
        """Bytes of the KV pool: whole blocks of what the weights and the reserve leave (0 when nothing does)."""
        room = int(self.device_bytes * self.utilization) - self.weights - self.reserve
        return max(0, room // self.kv_bytes_per_block * self.kv_bytes_per_block)

    @property
    def kv_tokens(self) -> int:
        return self.kv_pool // self.kv_bytes_per_block * self.block_size

    @property
    def full_sequences(self) -> int:
        """Sequences of max_seq_len positions the pool holds at once (shorter ones: more)."""
        return self.kv_tokens // self.max_seq_len

    @property
    def fits(self) -> bool:
        return self.full_sequences >= 1

    def describe(self) -> str:
        head = (f"on a {self.device_bytes / GIB:.0f} GiB GPU at utilization {self.utilization:g}: weights "
                f"{self.weights / GIB:.2f} GiB ({self.dtype}), activations and graphs {self.reserve / GIB:.0f} GiB, ")
        if not self.fits:
            return head + (f"KV pool {self.kv_pool / GIB:.2f} GiB: DOES NOT FIT one {self.max_seq_len}-token "
                           "sequence; a larger GPU, a higher utilization, or tensor parallel")
        return head + (f"KV pool {self.kv_pool / GIB:.2f} GiB = {self.kv_tokens:,} tokens "
                       f"({self.full_sequences:,} sequences of max_seq_len {self.max_seq_len})")

    def shown(self, source: str) -> dict:
        """What inspect and plan print and give as JSON: the figures, where the GPU's size came from, the line."""
        return {**self.to_json(), "source": source, "line": self.describe()}

    def to_json(self) -> dict:
        return {"device_bytes": self.device_bytes, "utilization": self.utilization, "dtype": self.dtype,
                "weights_bytes": self.weights, "reserve_bytes": self.reserve, "kv_pool_bytes": self.kv_pool,
                "kv_tokens": self.kv_tokens, "full_sequences": self.full_sequences, "fits": self.fits}


def plan_device(model: ModelConfig, limits: Limits, dtype: str, device_bytes: int, *, utilization: float,
                reserve: int, block_size: int = 16) -> DevicePlan:
    """The plan of MODEL's torch backend with LIMITS in DTYPE (float16 / bfloat16) on a GPU of DEVICE_BYTES."""
    item = KV_ITEM_BYTES[dtype]
    weights = sum(math.prod(shape) for shape, _ in expected_shapes(model).values()) * item
    layout = PagedKVLayout.of(model, limits.max_seq_len, dtype, block_size=block_size)
    return DevicePlan(device_bytes, utilization, dtype, weights, reserve, layout.bytes_per_block, block_size,
                      limits.max_seq_len)
